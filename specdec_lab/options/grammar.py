"""Structured output under speculation: a grammar's mask at every scored position, on llguidance.

The grammar engine is llguidance (the `guidance` backend of vLLM, also used by llama.cpp and SGLang:
a 3 MB wheel with no dependencies; xgrammar, vLLM's default, pulls triton on Linux, a 286 MB wheel).
Its matcher walks tokens, fills the mask of the tokens allowed next, and rolls back. The lab reads it
through `Matcher`, five methods, so that another engine can stand in.

Under speculation the mask must follow the drafts. Row 0 of a step's target logits is masked at the
committed state; row i after the matcher has walked d_1..d_i; then the matcher rolls back those i and
walks only what the step commits. The draft proposes under the same masks as it drafts. A draft the
grammar refuses (a drafter without logits, such as prompt lookup, may propose one) gets p = 0 at its
row and is rejected, as plain constrained decoding would never have produced it; the rows after it
are never read. The output then follows constrained sampling from the target exactly.
"""
import json
from typing import Protocol

import torch

from .processor import Processor


class Matcher(Protocol):
    """The lab's side of a grammar engine: one matcher per generation."""

    def reset(self) -> None: ...  # back to the grammar's start

    def allowed(self) -> torch.Tensor: ...  # (V,) bool: the tokens the grammar allows next

    def try_consume(self, tokens: list) -> int: ...  # walk the longest allowed prefix; its length

    def rollback(self, n: int) -> None: ...  # undo the last n tokens walked

    def forced(self) -> list: ...  # the tokens the grammar allows and no other, from here

    def stopped(self) -> bool: ...  # the grammar has ended (it walked an end-of-sequence token)


_LL_TOKENIZERS = {}  # id(tokenizer) -> (tokenizer, llguidance's view of it): building one takes about 0.4 s


def _ll_tokenizer(tokenizer, vocab_size, eos_ids):
    import llguidance.hf
    key = (id(tokenizer), vocab_size, tuple(eos_ids or ()))
    if key not in _LL_TOKENIZERS:
        eos = list(eos_ids) if eos_ids else None
        _LL_TOKENIZERS[key] = (tokenizer, llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos))
    return _LL_TOKENIZERS[key][1]


class LLGuidanceMatcher:
    """Matcher over llguidance.LLMatcher. `grammar`: llguidance's grammar text (compile_grammar makes it)."""

    def __init__(self, grammar: str, tokenizer, vocab_size=None, eos_ids=None):
        import llguidance
        import llguidance.torch
        self._ll = llguidance
        self.tokenizer = _ll_tokenizer(tokenizer, vocab_size, eos_ids)
        self.vocab_size = vocab_size or self.tokenizer.vocab_size
        self.grammar = grammar
        self.matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if self.matcher.is_error():
            raise ValueError(f"grammar: {self.matcher.get_error()}")
        self._bitmask = llguidance.torch.allocate_token_bitmask(1, self.vocab_size)  # (1, ceil(V / 32)) int32
        self._shifts = torch.arange(32, dtype=torch.int32)

    def reset(self):
        self.matcher.reset()

    def allowed(self):
        self._ll.torch.fill_next_token_bitmask(self.matcher, self._bitmask, 0)
        bits = (self._bitmask[0].view(-1, 1) >> self._shifts) & 1  # (words, 32): bit j of word w is token 32 w + j
        return bits.view(-1)[:self.vocab_size].bool()

    def try_consume(self, tokens):
        return self.matcher.try_consume_tokens(list(tokens)) if tokens else 0

    def rollback(self, n):
        if n and not self.matcher.rollback(n):
            raise RuntimeError(f"the grammar matcher could not roll back {n} tokens: {self.matcher.get_error()}")

    def forced(self):
        return list(self.matcher.compute_ff_tokens())

    def stopped(self):
        return self.matcher.is_stopped()

    def copy(self):
        """A fresh matcher for the same grammar (each generation needs its own)."""
        twin = object.__new__(LLGuidanceMatcher)
        twin.__dict__.update(self.__dict__)
        twin.matcher = self._ll.LLMatcher(self.tokenizer, self.grammar, log_level=0)
        twin._bitmask = self._bitmask.clone()
        return twin


def grammar_text(spec) -> str:
    """llguidance's grammar for `spec`: "json" (any JSON object: OpenAI's json_object), a JSON Schema
    (a dict), {"json_schema": schema}, {"regex": pattern}, {"lark": grammar} or {"gbnf": grammar}
    (llama.cpp's EBNF). An invalid one raises ValueError naming what is wrong."""
    import llguidance
    if spec == "json":
        spec = {"json_schema": {"type": "object"}}
    if not isinstance(spec, dict) or not spec:
        raise ValueError(f"grammar must be 'json', a JSON Schema (a dict) or one of {{'json_schema': ...}}, "
                         f"{{'regex': ...}}, {{'lark': ...}}, {{'gbnf': ...}}, got {spec!r}")
    kinds = {"json_schema", "regex", "lark", "gbnf"}
    if len(spec) == 1 and next(iter(spec)) in kinds:
        kind, body = next(iter(spec.items()))
    else:
        kind, body = "json_schema", spec
    try:
        if kind == "json_schema":
            if not isinstance(body, dict):
                raise ValueError(f"a JSON Schema must be an object (a dict), got {type(body).__name__}")
            return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(body))
        if not isinstance(body, str) or not body:
            raise ValueError(f"a {kind} grammar must be a non-empty string, got {body!r}")
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(body)
        return llguidance.LLMatcher.grammar_from_lark(body if kind == "lark" else llguidance.gbnf_to_lark(body))
    except ValueError as e:
        raise ValueError(f"grammar ({kind}): {e}") from None


def compile_grammar(spec, tokenizer, vocab_size=None, eos_ids=None) -> LLGuidanceMatcher:
    """A matcher for `spec` (grammar_text) over `tokenizer` (a fast Hugging Face tokenizer). The
    grammar is checked against the tokenizer here: an error names what llguidance found wrong."""
    import llguidance
    text = grammar_text(spec)
    ll_tok = _ll_tokenizer(tokenizer, vocab_size, eos_ids)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, ll_tok)
    if is_error:
        raise ValueError(f"grammar: {'; '.join(messages) or 'invalid'}")
    return LLGuidanceMatcher(text, tokenizer, vocab_size, eos_ids)


class GrammarProcessor(Processor):
    """A grammar's mask on the draft's logits and on every row of the target's, walked through the drafts
    and rolled back (module docstring). `rollback=False` is the broken variant that keeps the walked
    drafts, as if every draft had been accepted (tests show what it does). `jump_forward`: the drafter
    proposes the tokens the grammar forces (`forced`) without running its model. `mask_draft=False` lets the
    draft propose without the mask: exact still (verification masks p), and a measure of what the mask buys."""

    def __init__(self, matcher, rollback=True, jump_forward=True, mask_draft=True):
        self.matcher, self.rollback, self.jump_forward, self.mask_draft = matcher, rollback, jump_forward, mask_draft
        self._walked = 0  # drafts the matcher walked while the draft proposed them
        self._consumed = 0  # committed tokens the matcher walked

    def reset(self, prompt_ids):
        self.matcher.reset()
        self._walked = self._consumed = 0

    def mark(self):
        self._unwalk()
        return self._consumed

    def restore(self, mark):
        self._unwalk()
        self.matcher.rollback(self._consumed - mark)
        self._consumed = mark

    @staticmethod
    def _mask(logits, allowed):
        return logits.float().masked_fill(~allowed.to(logits.device), float("-inf"))

    def _unwalk(self):
        if self._walked and self.rollback:
            self.matcher.rollback(self._walked)
        self._walked = 0

    def _walk(self, drafted):
        self._walked += self.matcher.try_consume(drafted[self._walked:])  # drawn under the mask: all pass

    def forced(self, drafted):
        """The tokens the grammar allows and no other from here (a JSON key, a brace): the grammar as a
        drafter, at no model's cost. `jump_forward=False` turns it off, to measure what it adds."""
        if not self.jump_forward:
            return []
        self._walk(drafted)
        return self.matcher.forced()

    def draft(self, logits, drafted):
        if not self.mask_draft:  # the draft proposes freely (as vLLM's draft model does): still exact, less accepted
            return logits
        self._walk(drafted)
        allowed = self.matcher.allowed()
        masked = self._mask(logits, allowed)
        if not torch.isfinite(masked).any():  # the draft gives no allowed token any weight (a subset head):
            masked = self._mask(torch.zeros_like(logits, dtype=torch.float32), allowed)  # uniform over them
        return masked

    def target(self, logits, drafted):
        self._unwalk()
        rows, walked = [self.matcher.allowed()], 0
        for t in drafted:
            if self.matcher.try_consume([t]) == 0:
                break  # refused: p(t) = 0 rejects it, and no row after it is read
            walked += 1
            rows.append(self.matcher.allowed())
        if self.rollback:
            self.matcher.rollback(walked)
        rows += rows[-1:] * (logits.shape[0] - len(rows))
        return self._mask(logits, torch.stack(rows))

    def commit(self, committed, raw):
        self._unwalk()
        walked = self.matcher.try_consume(committed)  # past an end-of-sequence token it ends: the engine cuts there
        self._consumed += walked
        if walked != len(committed) and not self.matcher.stopped() and self.rollback:
            raise RuntimeError(f"the grammar refused a committed token in {committed}: the masks and the "
                               f"tokens disagree")
