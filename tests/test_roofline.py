"""roofline.py: the speedup formula, bytes per token, the hardware table, intensity, and the measurements."""
import math

import pytest

from specdec_lab.analysis import roofline as rf
from specdec_lab.analysis import timing
from specdec_lab.core.config import ModelConfig
from specdec_lab.io.pair import tiny_model


# --------------------------------------------------------------------------- the speedup formula

def test_expected_tokens_per_step_is_the_geometric_series():
    assert rf.expected_tokens_per_step(0.0, 4) == 1.0, "alpha = 0: only the correction token"
    assert rf.expected_tokens_per_step(1.0, 4) == 5.0, "alpha = 1: all K plus the bonus"
    for a in (0.1, 0.5, 0.9):
        for k in (1, 4, 16):
            assert rf.expected_tokens_per_step(a, k) == pytest.approx(sum(a ** i for i in range(k + 1)))


def test_expected_speedup_is_theorem_3_8_and_k1_is_the_corollary():
    for a in (0.0, 0.3, 0.8, 0.95):
        for c in (0.0, 0.05, 0.5):
            for k in (1, 3, 8):
                assert rf.expected_speedup(a, k, c) == pytest.approx((1 - a ** (k + 1)) / ((1 - a) * (k * c + 1)))
            assert rf.expected_speedup(a, 1, c) == pytest.approx((1 + a) / (1 + c)), "arXiv 2211.17192, Cor. 3.9"


def test_best_k_maximises_the_speedup_and_grows_with_alpha():
    for a, c in ((0.6, 0.05), (0.8, 0.1), (0.9, 0.02)):
        k = rf.best_k(a, c)
        assert all(rf.expected_speedup(a, k, c) >= rf.expected_speedup(a, j, c) for j in range(1, 17))
    assert rf.best_k(0.9, 0.05) > rf.best_k(0.6, 0.05)


@pytest.mark.parametrize("call,name", [(lambda: rf.expected_tokens_per_step(1.2, 4), "alpha"),
                                       (lambda: rf.expected_speedup(0.5, 4, -1.0), "c")])
def test_formula_rejects_bad_input(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# --------------------------------------------------------------------------- the 70B example and the table

def test_70b_fp16_example_from_the_seed_article():
    per_token = rf.bytes_per_token(70e9, bytes_per_param=2)
    assert per_token == 140e9
    assert rf.tokens_per_second_ceiling(per_token, 2.0e12) == pytest.approx(14.29, abs=0.01), "140 GB at 2.0 TB/s"
    a100 = rf.HARDWARE["A100 80GB"]
    assert rf.tokens_per_second_ceiling(per_token, a100.bandwidth) == pytest.approx(14.56, abs=0.01), \
        "the seed's 14.5 matches the datasheet's 2,039 GB/s, not 2.0 TB/s"
    assert rf.devices_needed(70e9, a100.memory_bytes, 2) == 2, "70B in FP16 does not fit on one 80 GB card"
    assert rf.devices_needed(70e9, rf.HARDWARE["H200"].memory_bytes, 2) == 1


def test_hardware_table_holds_the_datasheet_figures():
    expected = {  # name: (GB, TB/s, dense FP16 TFLOP/s)
        "A100 40GB": (40, 1.555, 312), "A100 80GB": (80, 2.039, 312),
        "H100 SXM": (80, 3.35, 989.5), "H200": (141, 4.8, 989.5),
    }
    assert set(rf.HARDWARE) == set(expected)
    for name, (gb, tbs, tflops) in expected.items():
        hw = rf.HARDWARE[name]
        assert hw.memory_bytes == pytest.approx(gb * 1e9)
        assert hw.bandwidth == pytest.approx(tbs * 1e12)
        assert hw.peak_flops == pytest.approx(tflops * 1e12)
        assert "nvidia.com" in hw.source and "datasheet" in hw.source, "each figure cites its vendor document"
        assert 100 < hw.ridge_intensity < 400, "every GPU of the table needs > 100 FLOP/byte to be compute-bound"


def test_hardware_rows_give_one_row_per_device_with_the_ceiling():
    rows = rf.hardware_rows(70e9)
    assert [r["device"] for r in rows] == list(rf.HARDWARE)
    for r, hw in zip(rows, rf.HARDWARE.values()):
        assert r["tokens_per_s_ceiling"] == pytest.approx(hw.bandwidth / 140e9)
        assert r["critical_batch"] == pytest.approx(hw.ridge_intensity)  # FP16: b / 2 = 1


# --------------------------------------------------------------------------- bytes per token

def test_llama_3_70b_shape_and_kv_bytes():
    cfg = rf.LLAMA_3_70B
    assert cfg.num_params == pytest.approx(70.55e9, rel=1e-3)
    assert rf.streamed_params(cfg) == cfg.num_params - cfg.vocab_size * cfg.dim, \
        "an untied input embedding is indexed, not streamed"
    assert rf.kv_bytes_per_position(cfg, 2) == 2 * 80 * 8 * 128 * 2 == 327680
    assert rf.bytes_per_token(cfg, context=1000) == pytest.approx(rf.bytes_per_token(cfg) + 1000 * 327680)


def test_a_tied_model_streams_every_parameter():
    cfg = rf.SMOLLM2_135M
    assert cfg.tie_embeddings and rf.streamed_params(cfg) == cfg.num_params
    assert rf.bytes_per_token(cfg, bytes_per_param=4) == 4 * cfg.num_params


def test_flops_per_token_is_two_per_weight_plus_attention():
    cfg = rf.LLAMA_3_8B
    assert rf.flops_per_token(cfg) == 2 * rf.streamed_params(cfg)
    extra = rf.flops_per_token(cfg, 100) - rf.flops_per_token(cfg)
    assert extra == 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * 100


@pytest.mark.parametrize("call,name", [
    (lambda: rf.bytes_per_token(70e9, context=10), "context"),
    (lambda: rf.bytes_per_token(70e9, context=-1), "context"),
    (lambda: rf.bytes_per_token(-5), "model"),
    (lambda: rf.bytes_per_token("70B"), "model"),
    (lambda: rf.bytes_per_token(70e9, bytes_per_param=0), "bytes_per_param"),
    (lambda: rf.kv_bytes_per_position(70e9), "cfg"),
    (lambda: rf.tokens_per_second_ceiling(1e9, 0), "bandwidth"),
    (lambda: rf.devices_needed(70e9, 0), "memory_bytes"),
    (lambda: rf.arithmetic_intensity(0), "tokens"),
    (lambda: rf.critical_batch_size(0, 1e12), "peak_flops"),
])
def test_bad_input_raises_value_error_naming_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


# --------------------------------------------------------------------------- intensity and the roofline

def test_decode_intensity_is_one_flop_per_byte_in_fp16_and_grows_with_t():
    assert rf.arithmetic_intensity(1, 2) == 1.0
    assert rf.arithmetic_intensity(1, 4) == 0.5
    assert rf.arithmetic_intensity(2048, 2) == 2048.0
    assert rf.matmul_intensity(1, 4096, 4096, 2) == pytest.approx(1.0, rel=1e-3), "the exact count tends to 2T/b"
    assert rf.matmul_intensity(4096, 4096, 4096, 2) == pytest.approx(4096 / 3)


def test_critical_batch_size_is_where_intensity_meets_the_ridge():
    for hw in rf.HARDWARE.values():
        for b in (2, 4):
            t = rf.critical_batch_size(hw.peak_flops, hw.bandwidth, b)
            assert rf.arithmetic_intensity(t, b) == pytest.approx(hw.ridge_intensity)
    assert rf.critical_batch_size(312e12, 2039e9, 2) == pytest.approx(153.0, abs=0.1)


def test_roofline_is_the_minimum_of_the_two_roofs():
    assert rf.attainable_flops(1.0, 100e12, 2e12) == 2e12
    assert rf.attainable_flops(1000.0, 100e12, 2e12) == 100e12


def test_forward_time_is_flat_below_the_critical_batch_and_linear_above():
    hw = rf.HARDWARE["H100 SXM"]
    t = [rf.forward_seconds(70e9, T, hw.peak_flops, hw.bandwidth) for T in (1, 5, 50, 1000, 2000)]
    assert t[0] == t[1] == t[2] == pytest.approx(140e9 / hw.bandwidth), "memory-bound: K+1 tokens cost one read"
    assert t[4] == pytest.approx(2 * t[3]), "compute-bound: time grows with T"


# --------------------------------------------------------------------------- measuring this machine

def test_measurements_return_plausible_rates():
    bw = timing.measure_memory_bandwidth(nbytes=1 << 22, reps=2)
    copy = timing.measure_memory_bandwidth(nbytes=1 << 22, reps=2, mode="copy")
    flops = timing.measure_matmul_flops(n=128, reps=2)
    for value in (bw, copy, flops):
        assert math.isfinite(value) and value > 1e8
    with pytest.raises(ValueError, match="mode"):
        timing.measure_memory_bandwidth(mode="write")


def test_best_seconds_takes_the_minimum_and_checks_reps():
    calls = []
    assert timing.best_seconds(lambda: calls.append(1), reps=3) >= 0
    assert len(calls) == 4, "one warm-up call plus reps timed calls"
    with pytest.raises(ValueError, match="reps"):
        timing.best_seconds(lambda: None, reps=0)


def test_measure_forward_seconds_times_each_t_and_leaves_no_trace():
    model = tiny_model(0)
    seconds = timing.measure_forward_seconds(model, [1, 4], context=8, reps=1)
    assert len(seconds) == 2 and all(s > 0 for s in seconds)
    with pytest.raises(ValueError, match="tokens"):
        timing.measure_forward_seconds(model, [0])


def test_model_config_and_count_agree_without_context():
    cfg = ModelConfig(vocab_size=100, dim=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, intermediate_size=32)
    assert rf.bytes_per_token(cfg) == rf.bytes_per_token(cfg.num_params) == 2 * cfg.num_params


def test_bandwidth_probe_measures_again_at_each_call():
    probe = timing.BandwidthProbe(nbytes=1 << 22, reps=2)
    a, b = probe(), probe()
    assert a > 0 and b > 0 and probe.samples == [a, b]


def test_bytes_per_token_takes_a_mean_context():
    cfg = ModelConfig()
    whole, half = rf.bytes_per_token(cfg, 100, 4), rf.bytes_per_token(cfg, 100.5, 4)
    assert half - whole == pytest.approx(0.5 * rf.kv_bytes_per_position(cfg, 4))
    with pytest.raises(ValueError, match="context"):
        rf.bytes_per_token(cfg, -1.0, 4)


# --------------------------------------------------------------------------- batches and launches

def test_a_batch_reads_the_weights_once_and_each_cache_once():
    hw = rf.HARDWARE["H200"]
    cfg = rf.LLAMA_3_8B
    one = rf.batch_forward_seconds(cfg, 1, 1, hw.peak_flops, hw.bandwidth, context=512)
    assert one == pytest.approx(rf.forward_seconds(cfg, 1, hw.peak_flops, hw.bandwidth, context=512))
    eight = rf.batch_forward_seconds(cfg, 8, 1, hw.peak_flops, hw.bandwidth, context=512)
    kv = 512 * rf.kv_bytes_per_position(cfg)
    assert eight - one == pytest.approx(7 * kv / hw.bandwidth), "seven more caches, the same weights"


def test_batch_speedup_at_batch_one_is_theorem_3_8_with_the_byte_ratio():
    hw = rf.HARDWARE["H200"]
    c = rf.streamed_params(rf.LLAMA_3_2_1B) / rf.streamed_params(rf.LLAMA_3_8B)
    for alpha, k in ((0.6, 2), (0.8, 4)):
        got = rf.batch_speedup(alpha, k, 1, rf.LLAMA_3_8B, rf.LLAMA_3_2_1B, hw.peak_flops, hw.bandwidth)
        assert got == pytest.approx(rf.expected_speedup(alpha, k, c)), "memory-bound: verification costs one read"


def test_batch_speedup_falls_with_the_batch_and_turns_into_a_loss_past_the_critical_batch():
    hw = rf.HARDWARE["H200"]
    s = [rf.batch_speedup(0.7, 4, b, rf.LLAMA_3_8B, rf.LLAMA_3_2_1B, hw.peak_flops, hw.bandwidth)
         for b in (1, 16, 64, 256, 1024)]
    assert all(a >= b for a, b in zip(s, s[1:])), s
    assert s[0] > 1.5 and s[-1] < 1.0, s
    critical = rf.critical_batch_size(hw.peak_flops, hw.bandwidth)
    below = int(critical // 5) - 1  # B(K+1) below the critical batch: verification still rides the read
    assert rf.batch_speedup(0.7, 4, below, rf.LLAMA_3_8B, rf.LLAMA_3_2_1B, hw.peak_flops, hw.bandwidth) \
        == pytest.approx(s[0])


def test_launch_bound_time_is_the_slower_of_host_and_device():
    assert rf.launch_bound_seconds(3e-3, 1000, 5e-6) == pytest.approx(5e-3), "eager: the host sets the pace"
    assert rf.launch_bound_seconds(3e-3, 100, 5e-6) == pytest.approx(3e-3), "few launches: the device does"
    assert rf.launch_bound_seconds(3e-3, 1000, 0.0, 1e-6) == pytest.approx(4e-3), "graphed: only the gaps remain"
    for kwargs, name in (({"launches": -1}, "launches"), ({"host_per_launch": -1.0}, "host_per_launch")):
        args = {"device_seconds": 1e-3, "launches": 10, "host_per_launch": 1e-6, **kwargs}
        with pytest.raises(ValueError, match=name):
            rf.launch_bound_seconds(**args)
    with pytest.raises(ValueError, match="batch"):
        rf.batch_forward_seconds(rf.LLAMA_3_8B, 0, 1, 1e15, 1e12)


def test_forward_rows_rounds_times_every_row_count_each_round_and_leaves_the_cache_as_it_was():
    model = tiny_model(0)
    per_round = timing.forward_rows_rounds(model, [1, 3, 2], context=8, rounds=4)
    assert len(per_round) == 4 and all(len(r) == 3 and all(s > 0 for s in r) for r in per_round)
    with pytest.raises(ValueError, match="rows"):
        timing.forward_rows_rounds(model, [1, 0])
    with pytest.raises(ValueError, match="rounds"):
        timing.forward_rows_rounds(model, [1], rounds=0)

