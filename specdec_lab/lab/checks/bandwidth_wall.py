"""Chapter 01's checks: the datasheet arithmetic, the decode ceiling, the cost of a forward by rows, and the
figures the chapter quotes from the GGUF file, docs/bench_fast_memory.json and docs/machine_profile.json."""
import json
from pathlib import Path

from ...analysis import roofline as rf
from ...analysis import timing

DOCS = Path(__file__).resolve().parents[3] / "docs"


def datasheet(hardware, kv_reserve, prefill_exact):
    """The datasheet table's arithmetic on every device of `hardware` (name -> device), 70B in FP16 against
    one card and an H200 with `kv_reserve` bytes of cache, the exact prefill intensity `prefill_exact` the
    prose quotes (about 1,550), and answer 1 (Llama-3-70B in FP8 on an H200)."""
    per_card = rf.bytes_per_token(70e9, bytes_per_param=2)
    for hw in hardware.values():
        one = rf.tokens_per_second_ceiling(per_card, hw.bandwidth)
        assert rf.tokens_per_second_ceiling(per_card / 2, hw.bandwidth) > 1.99 * one, \
            "half the bytes, twice the tokens/s"
        T_star = rf.critical_batch_size(hw.peak_flops, hw.bandwidth, 2)
        below = rf.attainable_flops(rf.arithmetic_intensity(T_star / 2, 2), hw.peak_flops, hw.bandwidth)
        assert below < hw.peak_flops, "below the critical T a forward must be memory-bound"
        assert all(rf.arithmetic_intensity(T, 2) < hw.ridge_intensity / 20 for T in (1, 5)), \
            f"decode and a K+1 = 5 verification pass must sit far left of the {hw.name}'s ridge"
    assert rf.devices_needed(70e9, hardware["A100 80GB"].memory_bytes, bytes_per_param=2) > 1, \
        "70B in FP16 cannot fit on one 80 GB card"
    h200 = hardware["H200"]
    assert per_card < h200.memory_bytes < per_card + kv_reserve, \
        "the weights fit an H200, the weights and a 32k cache do not"
    assert 1500 < prefill_exact < 1600, f"the exact prefill intensity is {prefill_exact:.0f}, not about 1,550"
    # answer 1
    fp8 = rf.bytes_per_token(rf.LLAMA_3_70B, context=0, bytes_per_param=1)
    assert round(rf.tokens_per_second_ceiling(fp8, h200.bandwidth)) == 69
    assert round(rf.critical_batch_size(2 * h200.peak_flops, h200.bandwidth, 1)) == 206
    assert fp8 + kv_reserve < h200.memory_bytes, "70B in FP8 fits one H200 with a 32k cache"


def decode_under_ceiling(bytes_per_param, cfg, context, bandwidth, measured):
    """Plain decode at `measured` tokens/s stays under the bandwidth ceiling of a model of shape `cfg` with
    weights of `bytes_per_param` bytes at `context` cached positions and `bandwidth` bytes/s. A forward that
    skipped weights would beat it. So does a miscount: a float32 weight counted as 32 bytes (its bits) cuts
    the ceiling eightfold, below even a decode slowed by the other core's jobs, and must fail here."""
    ceiling = rf.tokens_per_second_ceiling(rf.bytes_per_token(cfg, context=context, bytes_per_param=bytes_per_param),
                                           bandwidth)
    assert measured <= ceiling, "decode beat today's bandwidth ceiling: bytes miscounted?"


def plain_forward(target, seconds_by_rows, context):
    """The eager forward's shape: 8 rows in one forward far cheaper than 8 forwards (`seconds_by_rows`, T ->
    seconds, from the chapter's experiment), and two rows already dearer than one, timed here on `target`
    after `context` cached positions in 9 alternating rounds."""
    s1, s8 = seconds_by_rows[1], seconds_by_rows[8]
    # a shape, not a speed: the other core's jobs can slow any one timing several-fold
    assert s8 / 8 < 0.75 * s1, \
        f"8 tokens in one forward cost {s8 / s1:.1f}x one token: the weight read should be shared"
    # two rows against one, timed in alternating rounds, so that a burst of the other core's work falls on both
    # (the median ratio was 1.30 to 1.59 on machines of this kind, AVX2 and AVX-512, busy and quiet)
    two_over_one = sorted(r[1] / r[0] for r in timing.forward_rows_rounds(target, [1, 2], context=context, rounds=9))[4]
    assert two_over_one > 1.1, f"the eager forward: two rows already cost more than one ({two_over_one:.2f}x)"


def stored_figures(held, file_bytes, expanded):
    """The GGUF file against the float32 target (`held`: tensor type -> (weights, bytes); the file's bytes;
    the bytes expanded to float32), and the self-draft's figures from docs/bench_fast_memory.json."""
    assert round(expanded / 1e6) == 538 and round(file_bytes / 1e6) == 97, (expanded, file_bytes)
    assert round(expanded / file_bytes, 1) == 5.6, expanded / file_bytes
    assert set(held) == {"Q4_1", "Q8_0", "F32"}, held
    bench = json.loads((DOCS / "bench_fast_memory.json").read_text())
    self_k6 = bench["results"][0]["systems"]["spec_self_k6"]
    assert self_k6["k"] == 6 and round(self_k6["mean_tokens_per_step"], 2) == 6.39, self_k6["mean_tokens_per_step"]
    assert round(self_k6["alpha"], 2) == 1.00, self_k6["alpha"]


def machine_profile(profile, flops_per_row, live):
    """This machine: the profile's figures as the prose quotes them, its engine forward's ridge before the
    roofline's critical T, and today's forward by rows (`live`, T -> cost over one row) keeping the profile's
    shape. `flops_per_row` is the target's FLOPs per row at the profile's context."""
    assert profile["threads"] == 1
    assert f"{profile['bandwidth_read'] / 1e9:.1f} {profile['matmul_flops'] / 1e9:.1f}" == "32.6 80.3", profile
    assert f"{profile['ridge_intensity']:.2f} {profile['critical_rows_float32']:.1f}" == "2.46 4.9", profile
    assert profile["critical_rows_float32"] == round(
        rf.critical_batch_size(profile["matmul_flops"], profile["bandwidth_read"], 4), 1)
    # the engine's forward: the profile's, as the prose reads it
    fwd = profile["forward"]
    ratio = dict(zip(fwd["rows"], fwd["ratio_to_one_row"]))
    attained = {T: T * flops_per_row / (ms / 1e3) for T, ms in zip(fwd["rows"], fwd["ms_median"])}
    assert fwd["ridge_rows"] == max(T for T, r in ratio.items() if r <= 1.25) == 3, fwd["ridge_rows"]
    assert profile["critical_rows_float32"] > fwd["ridge_rows"], \
        "the forward stops being flat before the roofline's critical T"
    assert [round(ratio[T], 2) for T in (4, 8, 12, 33)] == [1.38, 2.64, 3.78, 8.72], ratio
    assert f"{flops_per_row / 1e6:.0f} {fwd['ms_median'][fwd['rows'].index(8)]:.1f} {attained[8] / 1e9:.0f}" \
        == "273 53.3 41"
    assert 0.45 < attained[8] / profile["matmul_flops"] < 0.55, "the 8-row forward attains about half the matmul's rate"
    assert all(abs(attained[T] / attained[8] - 1) < 0.1 for T in fwd["rows"] if 4 <= T <= 17), attained
    assert all(ratio[a] < ratio[b] for a, b in zip(fwd["rows"], fwd["rows"][1:])), "past one row, more rows cost more"
    assert live[17] > 1.5 and live[17] > max(live[T] for T in live if T <= fwd["ridge_rows"]), \
        f"today {live}: the shape changed"
