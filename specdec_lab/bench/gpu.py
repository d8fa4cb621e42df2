"""GPU mode: syncs per step as CUDA reports them, and random-weight pairs of real shapes
(Llama-3-8B / 3.2-1B, SmolLM2-1.7B / 135M) built on the device, where no weights can be downloaded."""
import torch

from ..analysis.roofline import expected_speedup
from ..analysis.syncs import count_cuda_syncs
from ..analysis.timing import BandwidthProbe, Clock
from ..api import SpeculativeEngine, autoregressive_generate
from ..core.config import ModelConfig
from ..core.model import Transformer, rope_table
from ..train.acceptance import measure_step_costs
from .run import _device_name, _model_info, roofline_report
from .systems import Tally


def cuda_syncs_per_step(target, draft, ids, k=4, max_new_tokens=32) -> dict:
    """Syncs per speculative step: as the engine counts them, and as CUDA reports them."""
    engine = SpeculativeEngine(target, draft, k=k)
    engine.generate(ids, max_new_tokens=8)  # warm-up
    res, n = count_cuda_syncs(lambda: engine.generate(ids, max_new_tokens=max_new_tokens))
    steps = max(res.stats.steps, 1)
    return {"k": k, "steps": res.stats.steps, "engine_counted_syncs_per_step": res.stats.syncs_per_step,
            "cuda_reported_syncs_per_step": None if n is None else n / steps}


def _llama(vocab, dim, layers, heads, kv_heads, inter, theta, tie):
    return ModelConfig(vocab_size=vocab, dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads,
                       head_dim=dim // heads, intermediate_size=inter, rope_theta=theta, max_seq_len=8192,
                       tie_embeddings=tie, eos_token_ids=())  # no EOS: random weights would stop anywhere


# Real shapes (from the models' config.json): target, draft.
SYNTHETIC = {
    "llama3-8b": (_llama(128256, 4096, 32, 32, 8, 14336, 500000.0, False),  # Llama-3-8B
                  _llama(128256, 2048, 16, 32, 8, 8192, 500000.0, True)),  # Llama-3.2-1B
    "smollm2-1.7b": (_llama(49152, 2048, 24, 32, 32, 8192, 130000.0, True),  # SmolLM2-1.7B
                     _llama(49152, 576, 30, 9, 3, 1536, 100000.0, True)),  # SmolLM2-135M
}


@torch.no_grad()
def random_model(cfg: ModelConfig, device, dtype=torch.bfloat16, seed=0, std=0.02):
    """A Transformer with random weights made directly on the device (init_weights draws
    on the host, which for 8B parameters takes minutes and 32 GB of host memory)."""
    with torch.device("meta"):
        model = Transformer(cfg).to(dtype)
    model = model.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.normal_(0.0, std, generator=g)
    cos, sin = rope_table(cfg)  # to_empty left the buffers uninitialised
    model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    return model.eval().requires_grad_(False)


def run_synthetic(preset, device="cuda", dtype=torch.bfloat16, ks=tuple(range(1, 9)), prompt_len=128,
                  max_new_tokens=128, reps=20, alphas=(0.6, 0.7, 0.8, 0.9), allow_cpu=False, log=None) -> dict:
    """Step costs, c, the AR decode's bandwidth fraction and syncs per step of a random-weight
    pair of real shapes. `preset` is a SYNTHETIC key or a (target_cfg, draft_cfg) pair.
    Random weights make alpha meaningless, so speedups are predicted over a range of alpha."""
    device = torch.device(device)
    if device.type != "cuda" and not allow_cpu:
        raise ValueError(f"--synthetic is GPU-only (it builds multi-billion-parameter models); "
                         f"device {str(device)!r} is not CUDA")
    if isinstance(preset, str) and preset not in SYNTHETIC:
        raise ValueError(f"synthetic preset must be one of {sorted(SYNTHETIC)}, got {preset!r}")
    tcfg, dcfg = SYNTHETIC[preset] if isinstance(preset, str) else preset
    if log:
        log("building random-weight models on the device ...")
    target, draft = random_model(tcfg, device, dtype, 0), random_model(dcfg, device, dtype, 1)
    bandwidth = BandwidthProbe(device, reps=5)()
    costs = measure_step_costs(target, draft, ks, prompt_len + max_new_tokens // 2, reps)
    ids = torch.randint(0, tcfg.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    autoregressive_generate(target, ids, max_new_tokens=8)  # warm-up
    clock, ar = Clock(device), Tally()
    t0 = clock()
    res = autoregressive_generate(target, ids, max_new_tokens=max_new_tokens)
    ar.add(ids, res.tokens, clock() - t0, res.stats, res.steps)
    syncs = cuda_syncs_per_step(target, draft, ids, k=min(4, max(ks)), max_new_tokens=min(32, max_new_tokens))
    predictions = {f"{a:g}": {k: {"speedup": expected_speedup(a, k, costs.c),
                                  "speedup_with_verify_cost": expected_speedup(a, k, costs.c, costs.verify_cost(k))}
                              for k in ks} for a in alphas}
    return {
        "synthetic": preset if isinstance(preset, str) else "custom",
        "machine": {"device": str(device), "device_name": _device_name(device),
                    "dtype": str(dtype).replace("torch.", "")},
        "models": {"target": _model_info(target), "draft": _model_info(draft)},
        "costs": {"context": costs.context, "target_forward_seconds": costs.target_forward,
                  "draft_forward_seconds": costs.draft_forward, "c": costs.c, "verify_seconds": costs.verify,
                  "verify_cost": {k: costs.verify_cost(k) for k in ks}},
        "roofline": roofline_report(target, ar, [ids], bandwidth, "analysis.timing.BandwidthProbe (sum)"),
        "syncs": syncs,
        "predicted": predictions,
    }
