"""Chapter 06's checks: the vectorised verifier decides as the reference loop and reads nothing on the host,
the engine syncs once per step, and the GPU model's predictions and the figures the chapter quotes.

`decides_like_reference` is a claim about a verifier, so the chapter runs it on `verify` and, through
`must_fail`, on `pitfalls.verify_resample_from_p`. The other functions check the chapter's own results,
passed in by name (`gpu_model` reads the many names of the model's cells from the notebook's `globals()`).
"""
import torch

from ...analysis import roofline as rf
from ...core.verify import verify_reference


def random_cases(n_cases, vocab, seed=0):
    """The chapter's random cases, K = 1..8 in turn, drawn in the notebook's order: a peaked p (K+1, V), a q
    that mixes p with noise (K, V), drafts d_i ~ q_i, and the uniforms u and exponentials E both verifiers share."""
    g = torch.Generator().manual_seed(seed)
    for case in range(n_cases):
        k = 1 + case % 8
        p = torch.softmax(3 * torch.randn(k + 1, vocab, generator=g), -1)
        noise = torch.softmax(3 * torch.randn(k, vocab, generator=g), -1)
        mix = torch.rand(k, 1, generator=g) ** 0.3
        q = mix * p[:k] + (1 - mix) * noise
        d = torch.multinomial(q, 1, generator=g).view(k)
        u = torch.rand(k, generator=g)
        e = torch.empty(vocab).exponential_(generator=g)
        yield d, p, q, u, e


def decides_like_reference(verifier, n_cases, vocab, seed=0):
    """`verifier(d, p, q, u, e)` returns the reference loop's [num_accepted, next_token] on every one of the
    chapter's random cases, which cover both a rejection and the bonus path. Only exact agreement on every
    case catches a verifier that draws the correction from p: it differs where the residual and p pick
    different tokens."""
    outcomes = {"rejected at some d_i": 0, "all accepted (bonus)": 0}
    for d, p, q, u, e in random_cases(n_cases, vocab, seed):
        ref = verify_reference(d, p, q, u, e).tolist()
        assert verifier(d, p, q, u, e).tolist() == ref, "the verifier must decide exactly as the reference loop"
        outcomes["all accepted (bonus)" if ref[0] == len(d) else "rejected at some d_i"] += 1
    assert min(outcomes.values()) > 0, "the cases must cover both a rejection and the bonus path"


def agreement(agree, agree_wrong, n_cases, outcomes):
    """The chapter's agreement count: all `n_cases` alike, fewer for chapter 02's bug, both paths covered."""
    assert agree == n_cases, "the vectorised verifier must decide exactly as the reference loop"
    assert agree_wrong < n_cases, "the same check must catch a verifier that draws the correction from p"
    assert min(outcomes.values()) > 0, "the cases must cover both a rejection and the bonus path"


def sync_counts(ks, syncs_ref, syncs_vec):
    """On the all-accepted path the loop makes 4K + 2 host syncs for each K in `ks`, the vectorised verifier none."""
    assert syncs_vec == [0] * len(ks), "the vectorised verifier must not read any value on the host"
    assert syncs_ref == [4 * k + 2 for k in ks], \
        "the loop reads d, p(d), q(d), u per accepted draft, the bonus, and copies the verdict back"


def engine_syncs(ref_stats, dev_stats, dev_counted, same_tokens):
    """The engine with either verifier: the default syncs once per step by its own record and by the outside
    count `dev_counted` (which also holds the prompt's two copies), the loop several times, and both give
    the same tokens from the same seed (`same_tokens`)."""
    assert dev_stats.syncs_per_step == 1.0, "the engine's default path must sync once per step"
    assert dev_counted == dev_stats.syncs + 2, \
        "the engine's own sync record must match the external count (plus the prompt's two copies)"
    assert ref_stats.syncs_per_step > 2, "the reference loop syncs several times per step"
    assert same_tokens, "both verifiers must produce the same tokens from the same seed"


def gpu_model(ns):
    """The GPU model's predictions and the figures its prose quotes, from the notebook's names in `ns`
    (its `globals()`): launches follow layers, not bytes; graphs beat eager; more syncs never help; the eager
    row reproduces the 25.5 tokens/s its host cost came from; and the answers to exercises 2 and 3."""
    n_t, n_d, gpu, h200 = ns["n_t"], ns["n_d"], ns["gpu"], ns["h200"]
    host, gap, sync = ns["HOST_PER_LAUNCH"], ns["GAP_PER_KERNEL"], ns["SYNC_SECONDS"]
    # the prediction: launches follow layers, not bytes; graphs beat eager; more syncs never help
    t_layers, d_layers = rf.LLAMA_3_8B.n_layers, rf.LLAMA_3_2_1B.n_layers
    assert abs(n_t[1].launches / n_d[1].launches - t_layers / d_layers) < 0.1, \
        "eager launches scale with the layer count"
    assert gpu["eager"]["c"] > gpu["CUDA graphs"]["c"] > gpu["bytes only (the roofline)"]["c"], gpu
    assert gpu["CUDA graphs"]["speedup"][0] > gpu["eager"]["speedup"][0], gpu
    assert all(g["speedup"][0] > g["speedup"][1] for g in gpu.values()), "more syncs per step must cost time"
    # the model's eager row reproduces the figure its host cost was derived from; the prose's figures
    assert abs(gpu["eager"]["ar_tokens_per_s"] - ns["GPT_FAST_EAGER_TOKENS_PER_S"]) < 1.0, gpu["eager"]
    assert 38e-6 < host < 40e-6, host
    assert 8.5 < gpu["CUDA graphs"]["ar_tokens_per_s"] / gpu["eager"]["ar_tokens_per_s"] < 10, gpu
    # the prediction's inputs and figures as the prose quotes them
    eager, graphs = gpu["eager"], gpu["CUDA graphs"]
    inputs = [host * 1e6, n_t[1].launches, gap * 1e6, sync * 1e6, h200.bandwidth / 1e12,
              h200.peak_flops // 1e12, h200.bandwidth / rf.HARDWARE["A100 80GB"].bandwidth]
    assert [f"{x:.1f}" for x in inputs] == ["39.1", "1003.0", "1.0", "20.0", "4.8", "989.0", "2.4"], inputs
    quoted = [eager["ar_tokens_per_s"], 100 * eager["fraction"], eager["c"], eager["speedup"][0], graphs["c"],
              graphs["speedup"][0]]
    assert [f"{x:.2f}" for x in quoted] == ["25.50", "8.05", "0.51", "0.89", "0.25", "1.37"], quoted
    assert gpu["eager"]["speedup"][0] < 1 < gpu["CUDA graphs"]["speedup"][0], "eager: a slowdown; graphs: a speedup"
    assert gpu["eager"]["ar_tokens_per_s"] < 0.2 * gpu["bytes only (the roofline)"]["ar_tokens_per_s"], \
        "eager is host-bound"
    target = rf.LLAMA_3_8B
    twice = 1 / rf.launch_bound_seconds(rf.forward_seconds(target, 1, h200.peak_flops, h200.bandwidth,
                                                           context=ns["CONTEXT"]),
                                        n_t[1].launches, host / 2, gap)
    assert round(twice) == 51, f"answer 3: half the host cost per launch gives {twice:.0f} tokens/s"
    assert 0.045 < ns["ref_stats"].syncs_per_step * sync / 3e-3 < 0.06 and 34 * sync / 3e-3 > 0.2, "answer 2"


def breakeven_with_launches(vec_launches, loop_launches, gpu_breakeven):
    """The eager break-even with launches counted: the vectorised verifier's launches do not grow with K, the
    loop's do; about 150 us at K = 1, and none from K = 8, where the loop launches more kernels."""
    assert round(gpu_breakeven[1] * 1e6, -1) == 150, gpu_breakeven
    assert len(set(vec_launches.values())) == 1 and 15 <= vec_launches[1] <= 30, vec_launches
    assert 100e-6 < gpu_breakeven[1] < 200e-6, gpu_breakeven
    assert loop_launches[8] > vec_launches[8] and gpu_breakeven[8] == gpu_breakeven[16] == 0.0, gpu_breakeven
