"""What a client asks for beside the prompt, kept exact under speculation: a grammar (structured
output), penalties, and the target's logprobs.

Each is a `Processor` (processor.py) that the engine calls at every position a step scores: the draft's
logits as it drafts, the target's K+1 rows before verification, each as if the tokens before it had
been generated, and the step's committed tokens with the target's raw logits after it. Verification
then compares the processed p with the processed q, so speculative sampling stays exact with respect to
the processed target: the output follows what plain decoding with the same options would give.
"""
from .grammar import GrammarProcessor, LLGuidanceMatcher, Matcher, compile_grammar
from .logprobs import Logprobs
from .penalties import Penalties
from .processor import Chain, Processor
from .request import request_processor

__all__ = ["Processor", "Chain", "request_processor", "GrammarProcessor", "Matcher", "LLGuidanceMatcher",
           "compile_grammar", "Penalties", "Logprobs"]
