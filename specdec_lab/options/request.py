"""One request's options as one processor (engine.generate's `processor`)."""
from .grammar import GrammarProcessor, compile_grammar
from .logprobs import Logprobs
from .penalties import Penalties
from .processor import Chain


def request_processor(tokenizer=None, vocab_size=None, grammar=None, presence_penalty=0.0, frequency_penalty=0.0,
                      repetition_penalty=1.0, logprobs=False, top_logprobs=0, eos_ids=None):
    """The processor for one request's options, or None when it asks for none of them.
    grammar: see grammar.grammar_text (needs the tokenizer; the grammar's end allows `eos_ids`).
    logprobs: record the target's log-probability of each generated token (and its `top_logprobs`
    most likely, 0 to 20)."""
    parts = []
    if presence_penalty or frequency_penalty or repetition_penalty != 1.0:
        parts.append(Penalties(presence_penalty, frequency_penalty, repetition_penalty))
    if grammar is not None:
        if tokenizer is None:
            raise ValueError("grammar needs the target's tokenizer (the model has none)")
        parts.append(GrammarProcessor(compile_grammar(grammar, tokenizer, vocab_size, eos_ids)))
    if not isinstance(logprobs, bool):
        raise ValueError(f"logprobs must be True or False, got {logprobs!r}")
    if logprobs or top_logprobs:
        parts.append(Logprobs(top_logprobs))
    return Chain(*parts) if parts else None
