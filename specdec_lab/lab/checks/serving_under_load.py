"""Chapter 13's checks: the batched server's rows, the stored load runs as the prose reads them, the
policies, paged memory, the H200 prediction and the server over HTTP.

Most functions take `ns`, the chapter's namespace (its `globals()`), and read the names its cells
defined; `serves_the_targets_answers` takes the server it checks, so the chapter runs it on a correct
server and on one with a broken rule."""
import json
import statistics
from pathlib import Path

from ...analysis.roofline import HARDWARE, critical_batch_size
from ..fragmentation import simulate_fragmentation
from . import take

DOCS = Path(__file__).resolve().parents[3] / "docs"


def serves_the_targets_answers(server, prompts, references, max_new_tokens):
    """A correct server's greedy rows: each row's output equals the target's own greedy answer to its
    prompt (`references`, one result per prompt), whatever the other rows accept."""
    handles = [server.submit(p, max_new_tokens=max_new_tokens) for p in prompts]
    server.run_until_idle()
    assert all(h.result().tokens == r.tokens for h, r in zip(handles, references)), \
        "every row's greedy output equals its batch-1 autoregressive output"


def ragged_rows(ns):
    """Section 1: ragged acceptance, rows arriving and leaving, greedy equality (and the stored
    96-prompt equality run)."""
    same, MAX_BATCH, log, rows_per_step, PROMPTS, K = take(ns, "same MAX_BATCH log rows_per_step PROMPTS K")
    assert all(same), "every row's greedy output equals its batch-1 autoregressive output"
    per_step = {}
    for steps in log.values():
        for s, (_, n) in steps.items():
            per_step.setdefault(s, []).append(n)
    assert any(len(set(counts)) > 1 for counts in per_step.values()), "rows accept different numbers at the same step"
    assert len({sum(n for _, n in steps.values()) / len(steps) for steps in log.values()}) > 1, "and overall"
    assert max(rows_per_step) == MAX_BATCH < len(PROMPTS) and min(log[4]) > 1 and min(log[5]) > 1, "4 and 5 join later"
    assert rows_per_step[-1] < MAX_BATCH, "the batch shrinks at the end"
    assert any(k < K for steps in log.values() for k, _ in steps.values()), "a row near its budget drafts fewer"
    equality = json.loads((DOCS / "serve_equality.json").read_text())
    assert equality["identical"] == equality["prompts"] == 96


def costs_by_rows(ns):
    """Section 2: the forward's cost by rows, the roofline, and the step costs' prediction."""
    (profile, by_rows, predicted, critical, forward, roofline_forward) = \
        take(ns, "profile by_rows predicted critical forward roofline_forward")
    assert f"{critical:.1f}" == "6.7" and profile["threads"] == 1
    assert f"{by_rows[5]:.2f}" == "1.67" and by_rows[5] > forward[(1, 5)] / forward[(1, 1)], \
        "the profile's forward is steeper"
    assert f"{forward[(1, 5)] / forward[(1, 1)]:.2f} {forward[(16, 5)] / forward[(16, 1)]:.2f}" == "1.08 4.49"
    assert f"{1e3 * roofline_forward[1]:.0f} {1e3 * forward[(1, 1)]:.0f}" == "25 26"
    assert f"{min(p[1] for p in predicted.values()):.2f} {max(p[1] for p in predicted.values()):.2f}" == "1.43 1.61"
    assert f"{predicted[4][2]:.2f} {predicted[1][4]:.2f}" == "1.11 1.20" and all(predicted[k][4] < 1 for k in (2, 3, 4))
    assert all(x < 1 for k in predicted for b, x in predicted[k].items() if b >= 8)


def crossover(ns):
    """Section 3: the crossover, measured against the roofline's, and what was measured at B = 8."""
    (cross_median, cross_fastest, critical, roof, stored, k1_at_8, cfg, medians, predicted) = \
        take(ns, "cross_median cross_fastest critical roof stored k1_at_8 cfg medians predicted")
    assert cross_median == {"fixed_1": 8, "fixed_2": 4, "fixed_4": 4} == cross_fastest
    assert roof["crossover_batch_predicted"] == 2 and 2 * (cfg["k"] + 1) > critical
    assert [f"{medians['fixed_4'][b]:.2f}" for b in ("2", "4")] == ["1.09", "0.78"] \
        and f"{medians['fixed_1']['4']:.2f}" == "1.07"
    assert 1 - medians["fixed_4"]["4"] > stored["noise"]["4"] and f"{stored['noise']['4']:.0%}" == "6%", \
        "beyond the noise at 4 rows"
    assert medians["fixed_4"]["2"] - 1 > stored["noise"]["2"], "K = 4 still pays at 2 rows, beyond the noise"
    # At B = 8: what was measured, and its spread
    measured_at_8 = f"{medians['fixed_1']['8']:.2f} {k1_at_8[0]:.2f} {k1_at_8[-1]:.2f} {stored['noise']['8']:.0%}"
    assert measured_at_8 == "0.95 0.92 1.01 13%"
    assert k1_at_8[0] < 1 < k1_at_8[-1] and 1 - medians["fixed_1"]["8"] < stored["noise"]["8"], "a tie within the noise"
    assert f"{medians['fixed_2']['8']:.2f} {medians['fixed_4']['8']:.2f}" == "0.86 0.72"
    closer = [abs(medians[f"fixed_{k}"][str(b)] - 1) < abs(x - 1) for k in cfg["fixed_ks"]
              for b, x in predicted[k].items()]
    assert (sum(closer), len(closer)) == (14, 15), closer


def policies(ns):
    """Section 4: the policies, and the goodput policy against plain and the best fixed K."""
    (sizes, by_goodput, at_once, medians, stored, same_goodput, cfg, PROMPTS, opened, schedule, choices, alpha) = \
        take(ns, "sizes by_goodput at_once medians stored same_goodput cfg PROMPTS opened schedule choices alpha")
    assert [schedule.k_for(b) for b in (1, 2, 3, 4, 5, 8, 9, 16)] == [4, 4, 2, 2, 1, 1, 0, 0]
    assert [choices[round(alpha, 2)][b] for b in cfg["batch_sizes"]] == [3, 2, 1, 0, 0]
    assert [choices[0.8][b] for b in cfg["batch_sizes"]] > [choices[round(alpha, 2)][b] for b in cfg["batch_sizes"]]
    goodput, vs_best = medians["goodput"], stored["goodput_vs_best_fixed_median"]
    for b in sizes:  # the goodput policy never fell below plain beyond the rep-to-rep noise (median and fastest runs)
        assert goodput[b] > 1 - stored["noise"][b] \
            and stored["throughput_over_plain"]["goodput"][b] > 1 - stored["noise"][b]
        assert abs(1 - vs_best[b]) <= 0.05 < stored["noise"][b] + 0.05, "within 5% of the best fixed K"
    assert [f"{goodput[b]:.2f}" for b in sizes] == ["1.37", "1.21", "1.08", "0.98", "0.91"]
    assert [f"{stored['noise'][b]:.0%}" for b in ("8", "16")] == ["13%", "14%"]
    assert all(stored["closed_loop"]["goodput"][b]["mean_k"] < 0.1 for b in ("8", "16")), \
        "from 8 rows it drafted almost nothing"
    history = by_goodput.k_history  # (rows, K) per step of the live goodput run
    assert all(same_goodput) and history[0][0] == len(PROMPTS) and history[-1][0] == 1
    few, many = ([k for b, k in history if test(b)] for test in (lambda b: b <= 2, lambda b: b >= 5))
    assert statistics.mean(few) > statistics.mean(many), "K follows the batch size: more drafts as the batch empties"
    p50 = {r: (opened["plain"][r]["latency_p50"], opened["goodput"][r]["latency_p50"]) for r in opened["plain"]}
    assert [f"{p50[r][1] / p50[r][0]:.2f}" for r in ("0.5", "1.0", "2.0")] == ["0.64", "0.64", "0.73"]
    assert all(opened[s][r]["tokens"] == cfg["open_requests"] * cfg["max_new_tokens"] == 12 * 32
              for s in opened for r in opened[s])
    assert at_once <= cfg["open_max_batch"] == 8, "no request waited for a slot"
    assert f"{opened['goodput']['2.0']['mean_k']:.2f} {opened['goodput']['0.5']['mean_k']:.1f}" == "1.55 2.7"


def paged_memory(ns):
    """Section 5: paged memory: better utilisation, more requests at once, repeatable for a seed."""
    result, p, c, kv_token, FRAG = take(ns, "result p c kv_token FRAG")
    assert result.paged.utilisation > 0.9 > 0.6 > result.contiguous.utilisation, result.summary()
    assert result.paged.mean_concurrent > 1.5 * result.contiguous.mean_concurrent, result.summary()
    assert simulate_fragmentation(**FRAG).summary() == result.summary(), \
        "the simulation must be deterministic for a seed"
    assert c.seconds / p.seconds < c.steps / p.steps, "a step that serves more requests must cost more time"
    assert p.tokens == c.tokens, "both designs serve the same workload"
    assert f"{c.seconds / p.seconds:.2f} {c.steps / p.steps:.2f}" == "1.06 1.57", result.summary()
    assert kv_token == 128 * 2**10 and FRAG["memory_tokens"] * kv_token == 4 * 2**30, "128 KiB a token, a 4 GiB pool"


def h200_prediction(ns):
    """Section 6: the H200 prediction, from the roofline (no GPU run of batched steps is stored)."""
    gpu_costs, h200, cross_8b, curves, profile = take(ns, "gpu_costs h200 cross_8b curves profile")
    assert gpu_costs is None, "the prose says no GPU measurement of batched steps is stored"
    critical_h200 = critical_batch_size(h200.peak_flops, h200.bandwidth)
    assert round(critical_h200) == 206 and round(critical_h200 / profile["critical_rows_float32"]) == 42
    assert cross_8b["K = 4, context 128"] == 95 and cross_8b["K = 2, context 128"] == 147
    assert all(v is None for n, v in cross_8b.items() if "4096" in n), \
        "long contexts: speculation pays up to full memory"
    assert max(curves["K = 4, context 4096"]) == 184 and f"{curves['K = 4, context 4096'][184]:.2f}" == "1.42"


def http_live(ns):
    """Section 7: the server over HTTP, live: the stream, the metrics, the refusal and the drop."""
    (dropped_tokens, streamed_ids, DEMO_TOKENS, refused, DEMO_BATCH, after, streams, DROPPED_TOKENS, in_process,
     full, during, web_thread, chunks) = \
        take(ns, "dropped_tokens streamed_ids DEMO_TOKENS refused DEMO_BATCH after streams DROPPED_TOKENS "
                 "in_process full during web_thread chunks")
    assert streamed_ids == in_process.tokens and "".join(text for *_, text in chunks) == in_process.text, \
        "the stream equals the in-process greedy decode of the same chat ids"
    assert len(streamed_ids) == DEMO_TOKENS and max(len(ids) for _, ids, _ in chunks) > 1, "a chunk: one step's tokens"
    assert (full["vllm:num_requests_running"], full["vllm:num_requests_waiting"], refused) == (DEMO_BATCH, 1, 429)
    assert during["vllm:kv_cache_usage_perc"] > 0 and after["vllm:kv_cache_usage_perc"] == 0.0, \
        "no block held after the drop"
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0, "nothing runs or waits"
    assert after["vllm:request_success_total[abort]"] == len(streams), "each dropped request was cancelled"
    assert 0 < dropped_tokens < DEMO_BATCH * DROPPED_TOKENS, "cancelled, not run out"
    assert not web_thread.is_alive(), "the server stopped at the end of its cell"


def http_stored(ns):
    """Section 7: three servers under one load (docs/serve_http_load.json)."""
    (bench_on_lab, rows_spec, rows_plain, hcfg, SERVERS, fwd, http_load, taus, phase, over_plain) = \
        take(ns, "bench_on_lab rows_spec rows_plain hcfg SERVERS fwd http_load taus phase over_plain")
    critical_h200 = critical_batch_size(HARDWARE["H200"].peak_flops, HARDWARE["H200"].bandwidth)
    assert (hcfg["k"], hcfg["threads"], hcfg["requests"], hcfg["max_tokens"]) == (2, 1, 8, 64)
    assert {s: {f"{t:.2f}" for t in ts}
              for s, ts in taus.items()} == {"lab": {"1.61"}, "llamacpp": {"1.53"}, "vllm": {"1.60"}}
    assert [f"{over_plain['1'][s]:.2f}" for s in SERVERS] == ["1.54", "0.63", "1.51"], \
        "at one client: the float32 servers gained"
    assert f"{1e3 * phase('llamacpp', 'plain', 'closed_loop', '1')['tpot']['p50']:.0f}" == "14"
    assert all(phase(s, m, loop, key)["ok"] == hcfg["requests"] for s in SERVERS for m in ("plain", "speculative")
               for loop, key in (("closed_loop", "1"), ("closed_loop", "4"), ("open_loop", "0.5")))
    assert [f"{over_plain['4'][s]:.2f}" for s in SERVERS] == ["0.98", "0.59", "0.93"] \
        and max(over_plain["4"].values()) < 1
    assert (rows_spec, rows_plain, fwd["ridge_rows"]) == (12, 4, 3) and rows_spec > rows_plain > fwd["ridge_rows"]
    assert bench_on_lab == {"Successful requests": "16", "Failed requests": "0", "Acceptance length": "1.33"}
    assert http_load["vllm_bench_serve_on_lab"]["returncode"] == 0
    assert rows_spec < critical_h200 / 10, "far below the H200's 206-row ridge"


def exercises(ns):
    """The exercises' answers."""
    step_costs, alpha, choices = take(ns, "step_costs alpha choices")
    critical_h200 = critical_batch_size(HARDWARE["H200"].peak_flops, HARDWARE["H200"].bandwidth)
    assert f"{step_costs[(16, 1)] / step_costs[(16, 0)]:.2f}" == "1.79" \
        and f"{1e3 * step_costs[(16, 1)]:.0f} {1e3 * step_costs[(16, 0)]:.0f}" == "115 64"
    score = {k: (1 - alpha ** (k + 1)) / (1 - alpha) / step_costs[(2, k)] for k in (1, 2, 3)}
    assert f"{score[1]:.1f} {score[2]:.1f} {score[3]:.1f}" == "48.9 50.8 50.1" and choices[round(alpha, 2)][2] == 2
    assert choices[0.8][2] == 3 and [f"{1e3 * step_costs[(2, k)]:.1f}" for k in (1, 2, 3)] == ["30.0", "33.1", "35.6"]
    tokens_per_step = f"{1 + alpha:.3f} {(1 - alpha ** 3) / (1 - alpha):.3f} {(1 - alpha ** 4) / (1 - alpha):.3f}"
    assert tokens_per_step == "1.466 1.683 1.784"
    assert 5 * 41 < critical_h200 < 5 * 42 and f"{(1 - 0.7 ** 5) / 0.3:.1f}" == "2.8"
