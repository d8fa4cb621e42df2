"""Plain configuration dataclasses: the model's shape and the sampling settings.

Shape letters (the package docstring's glossary): B batch, T new tokens, S cache capacity,
L layers, H query heads, Hkv key/value heads, D head dim, V vocab.
"""
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ModelConfig:
    vocab_size: int = 49152  # V; SmolLM2's tokenizer
    dim: int = 576  # hidden width
    n_layers: int = 30  # L
    n_heads: int = 9  # H
    n_kv_heads: int = 3  # Hkv; H / Hkv query heads share one key/value head (GQA)
    head_dim: int = 64  # D
    intermediate_size: int = 1536  # SwiGLU hidden width
    norm_eps: float = 1e-5  # RMSNorm epsilon
    rope_theta: float = 100000.0  # base of the rotary frequencies
    rope_scaling: dict | None = None  # Llama-3 style {"rope_type": "llama3", "factor": ...} or None
    max_seq_len: int = 8192  # positions the rotary table covers
    tie_embeddings: bool = True  # the output head reuses the embedding matrix
    qkv_bias: bool = False  # Qwen2 has biases on q, k and v
    eos_token_ids: tuple = (2,)  # generation stops at any of these
    architecture: str = "llama"  # the HF model_type the weights came from

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")

    @property
    def num_params(self) -> int:
        attn = self.dim * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
        mlp = 3 * self.dim * self.intermediate_size
        head = 0 if self.tie_embeddings else self.vocab_size * self.dim
        return self.vocab_size * self.dim + head + self.n_layers * (attn + mlp + 2 * self.dim) + self.dim


@dataclass
class SamplingConfig:
    temperature: float = 0.0  # 0 means greedy, its own path (no division by zero)
    top_k: int = 0  # 0 disables top-k
    top_p: float = 1.0  # nucleus mass in (0, 1]; 1 disables it (sampling.check_sampling_args checks all three)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


MAX_K = 16  # largest draft length the engine accepts; beyond it acceptance^K is negligible


def cache_dir() -> Path:
    """Where the project keeps what it fetches and builds: $SPECDEC_LAB_CACHE, or ~/.cache/specdec_lab."""
    d = Path(os.environ.get("SPECDEC_LAB_CACHE", "~/.cache/specdec_lab")).expanduser()
    d.mkdir(parents=True, exist_ok=True)
    return d
