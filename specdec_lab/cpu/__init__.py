"""The one seam for CPU speed (accelerate.py), the kernels behind it, and the self-draft they make possible."""
from .accelerate import accelerate, accelerated, eager, fast_modules, is_accelerated, unaccelerate
from .fused import FusedForward, OneTokenDecoder
from .self_draft import QuantizedDecoding, SelfDraft, SelfDrafter, best_weights

__all__ = ["accelerate", "accelerated", "eager", "fast_modules", "is_accelerated", "unaccelerate", "FusedForward", "OneTokenDecoder",
           "QuantizedDecoding", "SelfDraft", "SelfDrafter", "best_weights"]
