"""A request's options under speculation (specdec_lab/options/): a grammar (on llguidance), penalties and
logprobs. Each is exact: speculative sampling with the option follows plain decoding with it (a
chi-square on a toy vocabulary and grammar against the exact law, enumerated, for every verification
rule), greedy speculative output equals greedy plain decoding with the option on the real model, and
each broken variant (the target left unmasked, the draft's q left unmasked, no rollback, penalties that
forget the drafts) fails the same test."""
import json

import pytest
import torch
from scipy.stats import chisquare

from specdec_lab import ModelDrafter, SpeculativeEngine, autoregressive_generate, load_default_pair
from specdec_lab.core.engine import Engine
from specdec_lab.core.sampling import draft_token, logits_to_probs
from specdec_lab.io.pair import tiny_model
from specdec_lab.options import GrammarProcessor, Logprobs, Penalties, Processor, compile_grammar, request_processor
from specdec_lab.verification import verify_block, verify_match

EOS = 7
TOY_VOCAB = {"a": 0, "b": 1, "c": 2, "[": 3, "]": 4, ",": 5, "ab": 6, "<eos>": EOS}
PROMPT = [3, 0, 5, 1]
SAMPLES = 1200
STD = 0.3  # the random models' weight scale: their distributions' spread


@pytest.fixture(scope="module")
def toy_tokenizer():
    """A byte-level BPE tokenizer of eight tokens ("ab" merged), as llguidance reads any fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.BPE(vocab=TOY_VOCAB, merges=[("a", "b")], unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(["<eos>"])
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>")


@pytest.fixture(scope="module")
def default_pair():
    return load_default_pair()


@pytest.fixture(scope="module")
def toy_pair():
    """A random target and draft over 16 tokens (the toy tokenizer's 8 and 8 no grammar allows), EOS 7."""
    return (tiny_model(3, vocab_size=16, eos_token_ids=(EOS,), std=STD),
            tiny_model(4, vocab_size=16, n_layers=1, eos_token_ids=(EOS,), std=STD))


LIST_GRAMMAR = {"lark": 'start: "[" item ("," item)* "]"\nitem: "a" | "b" | "c" | "ab"'}
MAX_NEW = 5


def grammar_processor(tokenizer, **kw):
    return GrammarProcessor(compile_grammar(LIST_GRAMMAR, tokenizer, vocab_size=16, eos_ids=[EOS]), **kw)


def exact_law(model, make_processor, max_new=MAX_NEW):
    """Every sequence plain sampling at temperature 1 can produce (to EOS or max_new tokens) with its
    probability: each position's p from the processor that has committed the prefix, one token at a time."""
    law = {}

    def walk(prefix, prob):
        if len(prefix) == max_new or (prefix and prefix[-1] in model.cfg.eos_token_ids):
            law[tuple(prefix)] = law.get(tuple(prefix), 0.0) + prob
            return
        proc = make_processor()
        proc.reset(PROMPT)
        for t in prefix:
            proc.commit([t], torch.zeros(1, 16))
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT + prefix]))[0, -1].double()
        p = torch.softmax(proc.target(logits[None].float(), [])[0].double(), -1)
        for t in torch.nonzero(p > 1e-12).flatten().tolist():
            walk(prefix + [t], prob * float(p[t]))
    walk([], 1.0)
    return law


def sample_law(engine, make_processor, n=SAMPLES, **kw):
    counts = {}
    proc = make_processor()
    for seed in range(n):
        out = tuple(engine.generate(PROMPT, max_new_tokens=MAX_NEW, temperature=1.0, seed=seed, processor=proc, **kw).tokens)
        counts[out] = counts.get(out, 0) + 1
    return counts


def pvalue(counts, law, n=SAMPLES):
    """Chi-square of the sampled sequences against the exact law; sequences the law gives under 5 expected
    draws share one bin, and a sequence the law forbids makes the p-value 0."""
    if any(seq not in law for seq in counts):
        return 0.0
    big = [s for s, p in law.items() if p * n >= 5]
    obs = [counts.get(s, 0) for s in big] + [n - sum(counts.get(s, 0) for s in big)]
    exp = [law[s] * n for s in big] + [n * (1 - sum(law[s] for s in big))]
    if exp[-1] < 1e-9:
        obs, exp = obs[:-1], exp[:-1]
    return chisquare(obs, exp).pvalue


class UnmaskedQDrafter(ModelDrafter):
    """Broken: draws each draft under the grammar's mask but reports the q of the unmasked logits."""

    def propose(self, k, sampling, generator):
        x, ids, qs = self.pending.view(1, -1), [], []
        for _ in range(k):
            raw = self._feed(x)
            d, _ = draft_token(self.processor.draft(raw, [int(t) for t in ids]), sampling, generator)
            qs.append(logits_to_probs(raw, sampling.temperature))
            ids.append(d)
            x = d.view(1, 1)
        return torch.stack(ids), torch.stack(qs)


class UnmaskedTarget(GrammarProcessor):
    """Broken: the draft proposes under the mask, the target's rows are left as they are."""

    def target(self, logits, drafted):
        self._unwalk()
        return logits

    def commit(self, committed, raw):
        self.matcher.try_consume(committed)  # a token outside the grammar ends the walk; nothing raises


def engine_for(toy_pair, rule="device", drafter=ModelDrafter):
    target, draft = toy_pair
    verifier = {"device": "device", "block": verify_block, "match": verify_match}[rule]
    return Engine(target, drafter(draft, 64), k=2, cache=target.new_cache(64), verifier=verifier)


@pytest.mark.parametrize("rule,mask_draft", [("device", True), ("block", True), ("match", True), ("device", False)])
def test_speculative_sampling_under_a_grammar_follows_constrained_sampling(toy_pair, toy_tokenizer, rule, mask_draft):
    """Every rule; and a draft that proposes without the mask (only the target's rows masked) is exact too."""
    law = exact_law(toy_pair[0], lambda: grammar_processor(toy_tokenizer))
    assert abs(sum(law.values()) - 1) < 1e-9 and len(law) > 20
    engine = engine_for(toy_pair, rule)
    counts = sample_law(engine, lambda: grammar_processor(toy_tokenizer, mask_draft=mask_draft,
                                                          jump_forward=mask_draft))
    assert pvalue(counts, law) > 1e-3, rule
    assert engine.drafter.processor is not None  # the draft proposed with the grammar's processor
    if mask_draft:
        assert engine.drafter.forced_drafted >= SAMPLES  # and the grammar proposed each answer's "[" itself


@pytest.mark.parametrize("broken", ["target unmasked", "q unmasked", "no rollback"])
def test_each_broken_grammar_variant_fails_the_same_test(toy_pair, toy_tokenizer, broken):
    law = exact_law(toy_pair[0], lambda: grammar_processor(toy_tokenizer))
    make = {"target unmasked": lambda: UnmaskedTarget(compile_grammar(LIST_GRAMMAR, toy_tokenizer, 16, [EOS])),
            "q unmasked": lambda: grammar_processor(toy_tokenizer),
            "no rollback": lambda: grammar_processor(toy_tokenizer, rollback=False)}[broken]
    engine = engine_for(toy_pair, drafter=UnmaskedQDrafter if broken == "q unmasked" else ModelDrafter)
    counts = sample_law(engine, make, n=1000)
    assert pvalue(counts, law, n=1000) < 1e-6, broken


class ForgetfulPenalties(Penalties):
    """Broken: every row of a step penalised as if no draft had been written."""

    def target(self, logits, drafted):
        return self._apply(logits, [[] for _ in range(logits.shape[0])])


@pytest.mark.parametrize("rule", ["device", "block", "match"])
def test_speculative_sampling_with_penalties_follows_penalised_sampling(rule):
    """Over 16 tokens with EOS rare, so that answers run to 4 tokens and steps accept several drafts (the
    draft is a copy of the target): the case where forgetting the drafts changes the law. Every rule."""
    target = tiny_model(5, vocab_size=16, eos_token_ids=(15,), std=STD)
    make = lambda: Penalties(presence=1.5, frequency=1.0, repetition=1.8)  # noqa: E731
    law = exact_law(target, make, max_new=4)
    engine = engine_for((target, target), rule)
    counts = {}
    proc = make()
    for seed in range(SAMPLES):
        out = tuple(engine.generate(PROMPT, max_new_tokens=4, temperature=1.0, seed=seed, processor=proc).tokens)
        counts[out] = counts.get(out, 0) + 1
    assert pvalue(counts, law) > 1e-3
    broken, proc = {}, ForgetfulPenalties(presence=1.5, frequency=1.0, repetition=1.8)
    for seed in range(SAMPLES):
        out = tuple(engine.generate(PROMPT, max_new_tokens=4, temperature=1.0, seed=seed, processor=proc).tokens)
        broken[out] = broken.get(out, 0) + 1
    assert pvalue(broken, law) < 1e-4, "penalties that forget the drafts must fail"


def test_bad_options_are_refused_with_the_parameter_named(toy_tokenizer):
    for kw, name in [({"presence_penalty": 3}, "presence_penalty"), ({"frequency_penalty": "x"}, "frequency_penalty"),
                     ({"repetition_penalty": 0}, "repetition_penalty"), ({"top_logprobs": 21}, "top_logprobs"),
                     ({"logprobs": 1}, "logprobs")]:
        with pytest.raises(ValueError, match=name):
            request_processor(**kw)
    for bad in [{"type": "object", "properties": {"a": {"type": "nonsense"}}}, {"regex": "(a"}, {"lark": "start: ("},
                42, {"json_schema": "not a schema"}]:
        with pytest.raises(ValueError, match="grammar"):
            request_processor(toy_tokenizer, 16, grammar=bad)
    with pytest.raises(ValueError, match="tokenizer"):
        request_processor(grammar="json")


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}
ASK = "Give me a JSON record for a person called Ada who is 36 and lives in London."


@pytest.mark.slow
@pytest.mark.parametrize("grammar", [SCHEMA, {"regex": "(yes|no), because [a-z ]{5,40}\\."}, "json"])
def test_greedy_speculative_output_under_a_grammar_equals_constrained_greedy_decoding(default_pair, grammar):
    pair = default_pair
    ask = ASK if grammar != "json" else "Return a JSON object with the keys name and age for Ada, 36."
    engine = SpeculativeEngine(pair.target, pair.draft, k=3)
    got = engine.generate(ask, max_new_tokens=48, grammar=grammar)
    proc = request_processor(pair.tokenizer, pair.target.cfg.vocab_size, grammar=grammar,
                             eos_ids=pair.target.cfg.eos_token_ids)
    want = autoregressive_generate(pair.target, ask, max_new_tokens=48, processor=proc)
    assert got.tokens == want.tokens
    if grammar != "json":  # a schema's keys, a regex's fixed words: the grammar drafts them for free
        assert engine.drafter.forced_accepted > 0
    if isinstance(grammar, dict) and "regex" not in grammar:
        record = json.loads(got.text)
        assert set(record) == {"name", "age", "city"} and isinstance(record["age"], int)
    elif grammar == "json":
        assert json.loads(got.text) == {"name": "Ada", "age": 36}
    else:
        assert got.text.startswith(("yes, because ", "no, because ")) and got.text.endswith(".")


@pytest.mark.slow
def test_greedy_speculative_output_with_penalties_equals_penalised_greedy_decoding(default_pair):
    pair = default_pair
    engine = SpeculativeEngine(pair.target, pair.draft, k=4)
    kw = {"presence_penalty": 1.2, "frequency_penalty": 0.6, "repetition_penalty": 1.3}
    got = engine.generate("List ten fruits.", max_new_tokens=40, **kw)
    want = autoregressive_generate(pair.target, "List ten fruits.", max_new_tokens=40,
                                   processor=Penalties(kw["presence_penalty"], kw["frequency_penalty"],
                                                       kw["repetition_penalty"]))
    plain = autoregressive_generate(pair.target, "List ten fruits.", max_new_tokens=40)
    assert got.tokens == want.tokens and want.tokens != plain.tokens  # the penalties changed the answer


@pytest.mark.slow
def test_logprobs_come_from_the_verification_pass_and_equal_plain_decodings(default_pair):
    pair = default_pair
    engine = SpeculativeEngine(pair.target, pair.draft, k=4)
    got = engine.generate("Why is the sky blue?", max_new_tokens=32, logprobs=True, top_logprobs=3, seed=5,
                          temperature=0.7)
    rec = Logprobs(3)
    want = autoregressive_generate(pair.target, "Why is the sky blue?", max_new_tokens=32, processor=rec, seed=5,
                                   temperature=0.7)
    assert len(got.logprobs) == len(got.tokens)
    assert [e["token"] for e in got.logprobs] == got.tokens
    assert got.stats.mean_tokens_per_step > 1  # speculation ran: more than one token a step
    ar = {i: e for i, e in enumerate(rec.entries)}
    same = [i for i in range(min(len(got.tokens), len(want.tokens))) if got.tokens[:i + 1] == want.tokens[:i + 1]]
    assert same, "the two runs must share at least their first token"
    for i in same:  # where the prefixes agree the distributions are the same, to float32 rounding
        assert abs(got.logprobs[i]["logprob"] - ar[i]["logprob"]) < 1e-4
        assert [t for t, _ in got.logprobs[i]["top"]] == [t for t, _ in ar[i]["top"]]
    assert all(e["logprob"] <= 0 and len(e["top"]) == 3 for e in got.logprobs)


def test_the_stored_structured_output_run_holds_and_benchmarks_md_quotes_it():
    """docs/options.json (scripts/options_bench.py): every schema answer valid, every speculative answer
    equal to plain decoding's, and section 40's table quoting the stored figures."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    doc = json.loads((root / "docs" / "options.json").read_text())
    lab, vllm = doc["lab"], doc["vllm"]
    n = len(doc["requests"])
    for name, row in {**lab, **vllm}.items():
        if "valid" in row:
            assert row["valid"] == n, name
        if "equal_to_plain" in row:
            assert row["equal_to_plain"] == n, name
    assert lab["speculative, schema"]["forced_accepted"] <= lab["speculative, schema"]["forced_drafted"]
    section = (root / "docs" / "benchmarks.md").read_text().split("## 40.")[1]
    for row in (*lab.values(), *vllm.values()):
        assert f"{row['tokens_per_second']:.2f}" in section
    assert f"{lab['speculative, schema']['tokens_per_step']:.2f}" in section


def _options_chain(tokenizer):
    from specdec_lab.options import Chain
    return Chain(Penalties(presence=0.5, frequency=0.3, repetition=1.2), grammar_processor(tokenizer), Logprobs(2))


class FailsOnce(Processor):
    """Raises from its commit the `at`-th time: a fault in the middle of a batched step's commits."""

    def __init__(self, at):
        self.at, self.calls = at, 0

    def commit(self, committed, raw):
        self.calls += 1
        if self.calls == self.at:
            raise RuntimeError("injected")


def test_a_failed_batched_step_puts_every_rows_options_back(toy_pair, toy_tokenizer):
    """The batched server's step is a transaction: a step that raises in the last row's commit, after the
    rows before it committed (their grammar walked, their penalties counted, their logprobs recorded), leaves
    every row's processor as it was; the rows then finish as a run with no fault does, token for token,
    with one logprob per token."""
    from specdec_lab.options import Chain
    from specdec_lab.serve import BatchEngine, make_sequence
    target, draft = toy_pair

    def run(fault):
        engine = BatchEngine(target, draft, num_blocks=64, block_size=4, max_seq_len=64)
        procs = [_options_chain(toy_tokenizer) for _ in range(4)]
        procs[-1] = Chain(procs[-1], FailsOnce(2 if fault else 0))
        seqs = [make_sequence(PROMPT, MAX_NEW, temperature=0.9, seed=s, k=2, eos_ids=(EOS,), processor=p)
                for s, p in enumerate(procs)]
        engine.prefill(seqs)
        faults = 0
        while any(not s.finished for s in seqs):
            try:
                engine.step([s for s in seqs if not s.finished])
            except RuntimeError:
                faults += 1
        return seqs, faults

    clean, none = run(fault=False)
    faulty, one = run(fault=True)
    assert (none, one) == (0, 1)
    for a, b in zip(clean, faulty):
        assert a.output == b.output
        entries = b.processor.find(Logprobs).entries
        assert [e["token"] for e in entries][:len(b.output)] == b.output and len(entries) >= len(b.output)
    assert all(s.output[0] == 3 for s in clean), "the grammar's first token, a '['"
