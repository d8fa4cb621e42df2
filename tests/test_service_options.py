"""The request options under speculation over HTTP, with the real openai client against the default pair
served by `serve`'s stack (Server, Service, uvicorn): a json_schema answer that parses and validates,
streamed and not; logprobs equal to in-process autoregressive decoding's; n answers that a seed repeats."""
import json

import jsonschema
import openai
import pytest

import specdec_lab as sl
from specdec_lab.options import Logprobs
from specdec_lab.serve import Server
from specdec_lab.service import Service
from test_service import Running

MODEL = "SmolLM2-135M-Instruct"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                           "age": {"type": "integer", "minimum": 0},
                                           "languages": {"type": "array", "items": {"type": "string", "maxLength": 30},
                                                         "maxItems": 3}},
          "required": ["name", "age", "languages"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Give Ada Lovelace as JSON: her name, her age (36) and up to three languages "
                                   "she knew."}]


@pytest.fixture(scope="module")
def served():
    pair = sl.load_default_pair()
    running = Running(Service(Server(pair.target, pair.draft, max_batch=4, max_seq_len=512, k=3), MODEL))
    yield running, pair
    running.stop()


def _ids(pair, messages):
    ids = pair.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


@pytest.mark.slow
def test_a_json_schema_answer_parses_and_validates_streamed_and_not(served):
    running, pair = served
    client = running.client()
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    for extra in ({"temperature": 0}, {"temperature": 0.9, "seed": 11}):
        args = dict(model=MODEL, messages=ASK, max_tokens=80, response_format=fmt, **extra)
        whole = client.chat.completions.create(**args).choices[0]
        jsonschema.validate(json.loads(whole.message.content), SCHEMA)
        assert whole.finish_reason == "stop"
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **args)
                           if c.choices)
        assert streamed == whole.message.content  # the same answer: greedy, or the same seed
    free = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, temperature=0).choices[0]
    with pytest.raises(ValueError):  # without the schema the model writes prose around its JSON, if any
        jsonschema.validate(json.loads(free.message.content), SCHEMA)
    short = [{"role": "user", "content": "Return a JSON object with the keys name and age for Ada, 36."}]
    obj = client.chat.completions.create(model=MODEL, messages=short, max_tokens=60, temperature=0,
                                         response_format={"type": "json_object"}).choices[0].message.content
    assert json.loads(obj) == {"name": "Ada", "age": 36}


@pytest.mark.slow
def test_an_invalid_response_format_is_a_400_naming_the_field(served):
    running, _ = served
    bad = [{"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
           {"type": "json_schema", "json_schema": {"name": "x"}}, {"type": "xml"}]
    for fmt in bad:
        with pytest.raises(openai.BadRequestError) as e:
            running.client().chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, response_format=fmt)
        assert e.value.body["param"] == "response_format", fmt


@pytest.mark.slow
def test_logprobs_equal_in_process_autoregressive_decodings(served):
    running, pair = served
    client = running.client()
    messages = [{"role": "user", "content": "Why is the sky blue? One sentence."}]
    rec = Logprobs(3)
    want = sl.autoregressive_generate(pair.target, _ids(pair, messages), max_new_tokens=24, processor=rec)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0, logprobs=True,
                                       top_logprobs=3, extra_body={"return_token_ids": True}).choices[0]
    assert r.token_ids == want.tokens
    got = r.logprobs.content
    assert len(got) == len(want.tokens)
    for entry, ref in zip(got, rec.entries):
        assert abs(entry.logprob - ref["logprob"]) < 1e-4
        assert entry.token == pair.tokenizer.decode([ref["token"]]) and bytes(entry.bytes) == entry.token.encode()
        assert [t.token for t in entry.top_logprobs] == [pair.tokenizer.decode([t]) for t, _ in ref["top"]]
    chunks = [c for c in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0,
                                                         logprobs=True, stream=True) if c.choices]
    streamed = [e.logprob for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert len(streamed) == len(want.tokens)
    assert max(abs(a - b["logprob"]) for a, b in zip(streamed, rec.entries)) < 1e-4
    legacy = client.completions.create(model=MODEL, prompt=_ids(pair, messages), max_tokens=8, temperature=0,
                                       logprobs=2).choices[0].logprobs
    assert legacy.token_logprobs == pytest.approx([e["logprob"] for e in rec.entries[:8]], abs=1e-4)
    assert all(len(top) == 2 for top in legacy.top_logprobs) and legacy.text_offset[0] == 0


@pytest.mark.slow
def test_n_answers_with_a_seed_repeat_and_differ_from_each_other(served):
    running, _ = served
    client = running.client()
    args = dict(model=MODEL, messages=[{"role": "user", "content": "Invent a name for a cat."}], max_tokens=16,
                temperature=1.0, n=3, seed=7, presence_penalty=0.5)
    engine = running.service.server.engine
    read, shared = engine.positions_read, engine.positions_shared
    first = [c.message.content for c in client.chat.completions.create(**args).choices]
    prompt = len(_ids(served[1], args["messages"])) - 1  # the positions prefill reads (the last one is pending)
    assert (engine.positions_read - read, engine.positions_shared - shared) == (prompt, 2 * prompt), \
        "the three answers did not read their prompt once and share its blocks"
    again = [c.message.content for c in client.chat.completions.create(**args).choices]
    assert first == again and len(first) == 3
    assert len(set(first)) > 1, "three answers from three generators"
    chunks = [c for c in client.chat.completions.create(stream=True, **args) if c.choices]
    streamed = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices[0].index == i) for i in range(3)]
    assert streamed == first
