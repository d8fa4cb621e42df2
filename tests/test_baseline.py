"""The autoregressive baseline: greedy output equals transformers' greedy `generate`,
it stops where it should, seeded sampling repeats, and bad arguments are refused by name.

The speculative engine is measured against this baseline and its greedy path
must reproduce it, so the baseline itself is checked against transformers.
"""
import math

import pytest
import torch

from specdec_lab import autoregressive_generate
from specdec_lab.io.pair import tiny_model
from specdec_lab.core.text import encode_prompt

PROMPTS = ["Why is the sky blue?", "Write a haiku about the sea.", "What is 17 times 23?",
           "List three uses of a paperclip.", "Explain what a KV cache is in one paragraph."]


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# ---------------------------------------------------------------- against transformers (slow)

@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_equal_transformers_generate(default_target, hf_target, prompt):
    ids = encode_prompt(default_target.tokenizer, prompt)
    ours = autoregressive_generate(default_target, ids, max_new_tokens=48).tokens
    with torch.no_grad():
        out = hf_target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, max_new_tokens=48)
    theirs = out[0, len(ids):].tolist()  # transformers stops at EOS too, and keeps it
    n = min(len(ours), len(theirs))
    i = first_difference(ours, theirs)
    assert ours[:n] == theirs[:n], f"greedy tokens diverge from transformers' at new token {i}: {ours[i]} vs {theirs[i]}"
    assert len(ours) == len(theirs), (f"ours stops after {len(ours)} tokens, transformers after {len(theirs)}: "
                                      "EOS handling or the max_new_tokens budget is off")


@pytest.mark.slow
def test_text_prompt_gets_the_chat_template_and_text_is_the_decoded_tokens(default_target):
    tok = default_target.tokenizer
    res = autoregressive_generate(default_target, PROMPTS[0], max_new_tokens=8)
    assert res.prompt_ids == encode_prompt(tok, PROMPTS[0])
    turn = tok.encode("<|im_start|>assistant\n")
    assert res.prompt_ids[-len(turn):] == turn, \
        "the chat template's generation prompt is missing: the instruct model would continue the user's turn"
    assert res.text == tok.decode(res.tokens, skip_special_tokens=True)
    assert 1 <= len(res.tokens) <= 8


# ---------------------------------------------------------------- stopping (tiny model)

def test_greedy_equals_argmax_of_a_full_uncached_forward_at_every_step():
    """The slow reference twin: no cache, recompute everything, take the argmax."""
    model = tiny_model(0, eos_token_ids=())
    seq = [5, 9, 2, 7]
    res = autoregressive_generate(model, seq, max_new_tokens=16)
    ref = list(seq)
    with torch.no_grad():
        for _ in range(16):
            ref.append(int(model(torch.tensor([ref]))[0, -1].argmax()))
    assert res.tokens == ref[len(seq):], "cached greedy decode differs from recomputing the whole sequence"


def test_without_eos_exactly_max_new_tokens_are_generated():
    model = tiny_model(0, eos_token_ids=())
    for n in [1, 2, 7]:
        res = autoregressive_generate(model, [1, 2, 3], max_new_tokens=n)
        assert len(res.tokens) == n, f"asked for {n} tokens, got {len(res.tokens)} (the seed's loop overshoots)"


def test_generation_stops_at_the_first_eos_and_keeps_it():
    free = autoregressive_generate(tiny_model(0, eos_token_ids=()), [1, 2, 3], max_new_tokens=12).tokens
    j = next(i for i, t in enumerate(free) if i >= 2 and t not in free[:i])
    stopped = autoregressive_generate(tiny_model(0, eos_token_ids=(free[j],)), [1, 2, 3], max_new_tokens=12).tokens
    assert stopped == free[:j + 1], f"expected to stop at EOS {free[j]} at index {j}, got {stopped}"


def test_result_without_a_tokenizer_has_no_text_and_keeps_the_prompt_ids(tiny_pair):
    res = autoregressive_generate(tiny_pair.target, [4, 5, 6], max_new_tokens=3)
    assert res.text is None and res.prompt_ids == [4, 5, 6]
    assert all(isinstance(t, int) for t in res.tokens)


# ---------------------------------------------------------------- seeded sampling

@pytest.mark.parametrize("top_p,top_k", [(1.0, 0), (0.9, 0), (1.0, 10)])
def test_seeded_sampling_repeats_exactly(tiny_pair, top_p, top_k):
    kw = dict(max_new_tokens=24, temperature=1.0, top_p=top_p, top_k=top_k)
    a = autoregressive_generate(tiny_pair.target, [1, 2, 3], seed=0, **kw).tokens
    b = autoregressive_generate(tiny_pair.target, [1, 2, 3], seed=0, **kw).tokens
    assert a == b, "the same seed gave different samples: a generator is not passed down or not seeded"


def test_different_seeds_give_different_samples(tiny_pair):
    runs = {s: autoregressive_generate(tiny_pair.target, [1, 2, 3], max_new_tokens=24, temperature=1.0,
                                       seed=s).tokens for s in range(3)}
    assert len({tuple(r) for r in runs.values()}) == 3, f"seeds 0, 1, 2 gave {runs}: the seed is ignored"


def test_temperature_zero_ignores_the_seed(tiny_pair):
    a = autoregressive_generate(tiny_pair.target, [1, 2, 3], max_new_tokens=12, seed=0).tokens
    b = autoregressive_generate(tiny_pair.target, [1, 2, 3], max_new_tokens=12, seed=1).tokens
    assert a == b, "greedy decoding depends on the random generator"


# ---------------------------------------------------------------- bad input

BAD = [
    ("prompt", dict(prompt=[]), None),
    ("prompt", dict(prompt=""), None),
    ("prompt", dict(prompt="   "), None),
    ("prompt", dict(prompt=[1, 2.0]), None),
    ("prompt", dict(prompt={"ids": [1]}), None),
    ("tokenizer", dict(prompt="hello"), None),  # text, but the tiny model has no tokenizer
    ("max_new_tokens", dict(max_new_tokens=0), "0"),
    ("max_new_tokens", dict(max_new_tokens=-3), "-3"),
    ("max_new_tokens", dict(max_new_tokens=2.0), "2.0"),
    ("max_new_tokens", dict(max_new_tokens="8"), "'8'"),
    ("max_new_tokens", dict(max_new_tokens=True), "True"),
    ("max_new_tokens", dict(max_new_tokens=None), "None"),
    ("max_new_tokens", dict(max_new_tokens=511), "511"),  # 3 + 511 > max_seq_len 512
    ("max_new_tokens", dict(max_new_tokens=18, max_seq_len=20), "18"),  # 3 + 18 > 20
    ("temperature", dict(temperature=-0.1), "-0.1"),
    ("temperature", dict(temperature=-1), "-1"),
    ("temperature", dict(temperature=math.nan), "nan"),
    ("temperature", dict(temperature="hot"), "'hot'"),
    ("top_p", dict(top_p=0.0), "0.0"),
    ("top_p", dict(top_p=-0.5), "-0.5"),
    ("top_p", dict(top_p=1.01), "1.01"),
    ("top_p", dict(top_p=math.nan), "nan"),
    ("top_p", dict(top_p=None), "None"),
    ("top_k", dict(top_k=-1), "-1"),
]


@pytest.mark.parametrize("name,kwargs,value", BAD, ids=[f"{n}={kw}" for n, kw, _ in BAD])
def test_bad_argument_raises_value_error_naming_it_and_the_model_still_works(tiny_pair, name, kwargs, value):
    model = tiny_pair.target
    before = autoregressive_generate(model, [1, 2, 3], max_new_tokens=6).tokens
    args = dict(prompt=[1, 2, 3], max_new_tokens=6) | kwargs
    with pytest.raises(ValueError) as err:
        autoregressive_generate(model, args.pop("prompt"), **args)
    assert name in str(err.value), f"the error does not name the parameter {name!r}: {err.value}"
    if value is not None:
        assert value in str(err.value), f"the error does not show the bad value {value}: {err.value}"
    after = autoregressive_generate(model, [1, 2, 3], max_new_tokens=6).tokens
    assert after == before, "a refused call changed what the model generates afterwards"


def test_prompt_plus_max_new_tokens_up_to_max_seq_len_is_allowed(tiny_pair):
    res = autoregressive_generate(tiny_model(0, eos_token_ids=()), [1, 2, 3], max_new_tokens=17, max_seq_len=20)
    assert len(res.tokens) == 17, "the capacity check refuses a request that fits exactly"


@pytest.mark.parametrize("bad_ids", [[1, 64], [-1, 2]])
def test_prompt_ids_outside_the_vocabulary_raise_value_error(tiny_pair, bad_ids):
    with pytest.raises(ValueError, match="prompt"):
        autoregressive_generate(tiny_pair.target, bad_ids, max_new_tokens=2)
