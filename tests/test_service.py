"""The HTTP service, driven by real clients (the openai SDK, httpx, curl) against a real uvicorn server on a
port the OS picks. Tiny random models with token-id prompts keep it fast; one slow test runs the default
pair's chat template end to end."""
import asyncio
import json
import signal
import socket
import subprocess
import threading
import time

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import specdec_lab as sl
from specdec_lab.serve import Server
from specdec_lab.service import Service, http_server

TARGET, DRAFT = sl.tiny_model(0), sl.tiny_model(1, n_layers=1)
POISON = 61  # a token id the faulty target refuses to read (as in tests/test_serve_faults.py)
PROMPTS = [[1, 2, 3], [7, 8], [9, 10, 11, 12, 13, 14], [3]]  # none says POISON or EOS within its budget
BUDGETS = [18, 9, 14, 21]


class Running:
    """A uvicorn server in a thread, on a socket the OS bound to a free port; stop() ends it."""

    def __init__(self, service):
        self.service = service
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.uvicorn = http_server(service, log_level="warning", grace_seconds=5)
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.uvicorn.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)

    def client(self, **kw):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw)

    def metrics(self) -> dict:
        """{(name, labels except model_name and engine): value} of a scrape."""
        text = httpx.get(self.url + "/metrics").text
        return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine")))):
                s.value for f in text_string_to_metric_families(text) for s in f.samples}

    def stop(self):
        self.uvicorn.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def _service(target=TARGET, draft=DRAFT, max_batch=8, max_seq_len=128, on_batch=None, **kw):
    server = Server(target, draft, max_batch=max_batch, block_size=4, max_seq_len=max_seq_len, k=3,
                    on_batch=on_batch)
    return Service(server, "tiny", **kw)


@pytest.fixture(scope="module")
def tiny():
    running = Running(_service())
    yield running
    running.stop()


def _eventually(running, key, value, seconds=10):
    """Wait until the scraped metric `key` reads `value` (the engine thread reports between steps)."""
    deadline = time.monotonic() + seconds
    while running.metrics().get(key) != value:
        assert time.monotonic() < deadline, f"{key} is {running.metrics().get(key)}, not {value}"
        time.sleep(0.01)


def _greedy(prompt, n, target=TARGET):
    return sl.autoregressive_generate(target, prompt, max_new_tokens=n).tokens


def _ids(client, prompt, n, stream=False, **kw):
    """The token ids of a greedy completion of token-id `prompt` (vLLM's return_token_ids), and its finish."""
    args = dict(model="tiny", prompt=prompt, max_tokens=n, temperature=0, extra_body={"return_token_ids": True}, **kw)
    if not stream:
        r = client.completions.create(**args)
        assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(r.choices[0].token_ids)
        return r.choices[0].token_ids, r.choices[0].finish_reason
    ids, finish, usage = [], None, None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True}, **args):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            ids += c.token_ids
            finish = c.finish_reason or finish
    assert usage.completion_tokens == len(ids)
    return ids, finish


def test_greedy_completions_equal_autoregressive_decoding_streamed_and_not(tiny):
    client = tiny.client()
    for prompt, n in zip(PROMPTS, BUDGETS):
        want = _greedy(prompt, n)
        assert _ids(client, prompt, n) == (want, "length")
        assert _ids(client, prompt, n, stream=True) == (want, "length")
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert httpx.get(tiny.url + "/health").status_code == 200


def test_sixteen_concurrent_clients_each_get_their_batch_1_answer(tiny):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 60, (int(n),), generator=g).tolist() for n in torch.randint(1, 12, (16,), generator=g)]
    budgets = [int(n) for n in torch.randint(4, 24, (16,), generator=g)]
    client = openai.AsyncOpenAI(base_url=tiny.url + "/v1", api_key="none", max_retries=0)

    async def one(i):
        args = dict(model="tiny", prompt=prompts[i], max_tokens=budgets[i], temperature=0,
                    extra_body={"return_token_ids": True})
        if i % 2:
            r = await client.completions.create(**args)
            return r.choices[0].token_ids
        ids = []
        async for chunk in await client.completions.create(stream=True, **args):
            ids += [t for c in chunk.choices for t in c.token_ids]
        return ids

    async def everyone():
        try:
            return await asyncio.gather(*(one(i) for i in range(16)))
        finally:
            await client.close()

    steps = tiny.service.server.steps
    got = asyncio.run(everyone())
    assert tiny.service.server.steps - steps < sum(budgets) / 2, "the clients' requests shared batched steps"
    for p, n, ids in zip(prompts, budgets, got):
        assert ids == _greedy(p, n), p  # batch-1 decoding stops at EOS as the server does
    assert tiny.metrics()[("vllm:num_requests_running", ())] == 0


def test_a_client_that_disconnects_mid_stream_cancels_its_request_and_frees_its_blocks():
    slow = lambda server, record: time.sleep(0.02)  # noqa: E731  steps slow enough to leave mid-answer
    target = sl.tiny_model(0, eos_token_ids=())
    running = Running(_service(target, max_seq_len=256, on_batch=slow))
    try:
        body = {"prompt": [1, 2, 3], "max_tokens": 200, "temperature": 0, "stream": True}
        with httpx.Client() as http, http.stream("POST", running.url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
        _eventually(running, ("vllm:num_requests_running", ()), 0)
        _eventually(running, ("vllm:request_success_total", (("finished_reason", "abort"),)), 1)
        m = running.metrics()
        assert m[("vllm:request_success_total", (("finished_reason", "abort"),))] == 1
        assert m[("vllm:kv_cache_usage_perc", ())] == 0.0
        engine = running.service.server.engine
        assert engine.target_kv.used_blocks == 0 == engine.draft_kv.used_blocks
        assert m[("vllm:generation_tokens_total", ())] < 200, "it was cancelled, not run to its end"
        with pytest.raises(httpx.ReadTimeout):  # a non-streamed request whose client gives up
            httpx.post(running.url + "/v1/completions", json=body | {"stream": False}, timeout=0.5)
        _eventually(running, ("vllm:request_success_total", (("finished_reason", "abort"),)), 2)
        assert running.metrics()[("vllm:kv_cache_usage_perc", ())] == 0.0
        assert _ids(running.client(), [4, 5], 6) == (_greedy([4, 5], 6, target), "length"), "the server goes on"
    finally:
        running.stop()


BAD = [  # (body, the field the error must name)
    ({"prompt": [1, 2], "logit_bias": {"3": 5}}, "logit_bias"),
    ({"prompt": [1, 2], "frobnicate": True}, "frobnicate"),
    ({"prompt": [1, 2], "temperature": -0.5}, "temperature"),
    ({"prompt": [1, 2], "temperature": "hot"}, "temperature"),
    ({"prompt": [1, 2], "top_p": 1.5}, "top_p"),
    ({"prompt": [1, 2], "top_k": -3}, "top_k"),
    ({"prompt": [1, 2], "max_tokens": 0}, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": 120}, "max_tokens"),
    ({"prompt": [1, 2], "n": 9}, "n"),
    ({"prompt": [1, 2], "presence_penalty": 3}, "presence_penalty"),
    ({"prompt": [1, 2], "logprobs": 6}, "logprobs"),
    ({"prompt": [1, 2], "response_format": {"type": "json_object"}}, "response_format"),  # no tokenizer here
    ({"prompt": [1, 2], "seed": 1.5}, "seed"),
    ({"prompt": [1, 2], "stop": "x"}, "stop"),  # stop strings need a tokenizer; the tiny model has none
    ({"prompt": [1, 2], "stream": "yes"}, "stream"),
    ({"prompt": [1, 200]}, "prompt"),
    ({"prompt": list(range(1, 60)) * 2}, "prompt"),  # too long for 128 positions
    ({"prompt": "text"}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"max_tokens": 3}, "prompt"),
]


@pytest.mark.parametrize("body,param", BAD, ids=[f"{p}-{i}" for i, (_, p) in enumerate(BAD)])
def test_a_bad_request_is_answered_400_naming_the_field_and_queues_nothing(tiny, body, param):
    before = tiny.service.server._next_id
    r = httpx.post(tiny.url + "/v1/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and param in err["message"]
    assert tiny.service.server._next_id == before, "nothing may be queued"


def test_neutral_values_of_unsupported_fields_are_accepted_as_load_generators_send_them(tiny):
    body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0, "logprobs": None,
            "ignore_eos": False, "presence_penalty": 0, "frequency_penalty": 0.0, "n": 1, "best_of": None,
            "stop": [], "user": "bench", "top_k": -1, "stream": True, "stream_options": {"include_usage": True}}
    r = httpx.post(tiny.url + "/v1/completions", json=body)
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    usage = json.loads(r.text.split("\n\n")[-3].removeprefix("data: "))["usage"]
    assert usage == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


def test_the_sdk_sees_openai_errors_and_malformed_bodies_get_400_or_413(tiny):
    with pytest.raises(openai.BadRequestError) as e:
        tiny.client().completions.create(model="tiny", prompt=[1, 2], max_tokens=4, temperature=3.0)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError, match="messages"):
        tiny.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError):
        tiny.client().completions.create(model="gpt-4", prompt=[1, 2], max_tokens=4)
    for raw in (b"{not json", b"[1, 2]", "\xff".encode("latin-1")):
        r = httpx.post(tiny.url + "/v1/completions", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400 and "error" in r.json(), raw
    r = httpx.post(tiny.url + "/v1/completions", content=b" " * (1 << 20) + b"{}")
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_unknown_routes_and_methods_answer_in_openais_error_shape(tiny):
    r = httpx.post(tiny.url + "/v1/embeddings", json={"input": "hi"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
    assert "POST /v1/embeddings" in r.json()["error"]["message"] and "POST /v1/completions" in r.json()["error"]["message"]
    r = httpx.get(tiny.url + "/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed", r.text
    assert "POST" in r.headers["allow"], "the methods that are allowed, as HTTP asks"
    with pytest.raises(openai.NotFoundError) as e:  # the SDK reads the message from the body
        tiny.client().embeddings.create(model="tiny", input="hi")
    assert "no such route" in str(e.value)


def test_a_port_in_use_is_refused_before_anything_loads():
    from specdec_lab.service.app import check_port_free
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(OSError, match=f"--port {port} cannot be served"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)  # closed: free again
    check_port_free("127.0.0.1", 0)  # any free port


def test_without_the_api_key_nothing_runs():
    running = Running(_service(api_key="sesame"))
    try:
        for key in ("none", "sesame-not"):
            with pytest.raises(openai.AuthenticationError):
                running.client(api_key=key).completions.create(model="tiny", prompt=[1, 2], max_tokens=4)
        r = httpx.post(running.url + "/v1/completions", json={"prompt": [1, 2]})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert running.service.server._next_id == 0, "nothing may run without the key"
        assert _ids(running.client(api_key="sesame"), [1, 2], 5) == (_greedy([1, 2], 5), "length")
        assert httpx.get(running.url + "/health").status_code == 200  # as vLLM: /health and /metrics are open
    finally:
        running.stop()


def test_more_than_max_waiting_queued_is_answered_429_at_once():
    slow = lambda server, record: time.sleep(0.02)  # noqa: E731
    running = Running(_service(max_batch=1, max_waiting=1, on_batch=slow))
    try:
        client = running.client()
        results = {}
        first = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=18, temperature=0,
                                          stream=True, extra_body={"return_token_ids": True})
        ids = list(next(iter(first)).choices[0].token_ids)  # running now: the batch of one is full
        queued = threading.Thread(target=lambda: results.update(q=_ids(running.client(), PROMPTS[3], 21)))
        queued.start()
        _eventually(running, ("vllm:num_requests_waiting", ()), 1)
        t0 = time.monotonic()
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model="tiny", prompt=[5, 6], max_tokens=4)
        assert time.monotonic() - t0 < 2, "429 must come at once, not after the queue drains"
        ids += [t for chunk in first for c in chunk.choices for t in c.token_ids]
        queued.join(timeout=30)
        assert ids == _greedy(PROMPTS[0], 18) and results["q"] == (_greedy(PROMPTS[3], 21), "length")
    finally:
        running.stop()


class PoisonRunner:
    """Declines every forward (the eager code runs, unchanged) and raises on POISON: a fault inside a step."""
    name = "faulty"

    def logits(self, tokens, input_pos=None, *args):
        if (tokens == POISON).any():
            raise torch.OutOfMemoryError("injected: out of memory")

    hidden = logits


class OnceRunner:
    """Declines every forward and raises once, on the n-th: a step that fails and changes nothing."""
    name = "faulty-once"

    def __init__(self, n):
        self.n = n

    def logits(self, tokens, input_pos=None, *args):
        self.n -= 1
        if self.n == 0:
            raise torch.OutOfMemoryError("injected: out of memory, once")

    hidden = logits


def test_a_step_that_fails_once_is_run_again_and_every_answer_is_unchanged():
    target = sl.tiny_model(0)
    target.runner = OnceRunner(12)  # a forward of a batched step, after the prefills
    running = Running(_service(target))
    try:
        client = openai.AsyncOpenAI(base_url=running.url + "/v1", api_key="none", max_retries=0)

        async def one(prompt, n):
            r = await client.completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0)
            return r.choices[0].token_ids

        async def everyone():
            try:
                return await asyncio.gather(*(one(p, n) for p, n in zip(PROMPTS, BUDGETS)))
            finally:
                await client.close()

        got = asyncio.run(everyone())
        assert got == [_greedy(p, n) for p, n in zip(PROMPTS, BUDGETS)]
        assert running.service.engine.step_errors == 1
    finally:
        running.stop()


def test_a_failed_request_answers_500_and_harms_no_other():
    target = sl.tiny_model(0)
    target.runner = PoisonRunner()
    running = Running(_service(target))
    try:
        client = running.client()
        with pytest.raises(openai.InternalServerError, match="out of memory"):
            client.completions.create(model="tiny", prompt=[5, POISON, 6], max_tokens=6)
        body = {"prompt": [5, 6, POISON], "max_tokens": 6, "stream": True}
        events = httpx.post(running.url + "/v1/completions", json=body).text.split("\n\n")
        assert "out of memory" in json.loads(events[-3].removeprefix("data: "))["error"]["message"]
        assert events[-2] == "data: [DONE]"
        for prompt, n in zip(PROMPTS, BUDGETS):
            assert _ids(client, prompt, n) == (_greedy(prompt, n), "length")
        assert running.metrics()[("vllm:request_success_total", (("finished_reason", "error"),))] == 2
    finally:
        running.stop()


def test_sigterm_stops_admitting_lets_the_running_answer_finish_and_exits():
    slow = lambda server, record: time.sleep(0.02)  # noqa: E731
    running = Running(_service(on_batch=slow))
    stream = running.client().completions.create(model="tiny", prompt=PROMPTS[3], max_tokens=21, temperature=0,
                                                  stream=True)
    chunks = iter(stream)
    ids = list(next(chunks).choices[0].token_ids)
    running.uvicorn.handle_exit(signal.SIGTERM, None)  # what uvicorn's signal handler calls
    with pytest.raises((openai.APIConnectionError, openai.APIStatusError)):  # refused, or 503 while closing
        running.client().completions.create(model="tiny", prompt=[1, 2], max_tokens=4)
    ids += [t for chunk in chunks for c in chunk.choices for t in c.token_ids]
    assert ids == _greedy(PROMPTS[3], 21), "what ran when the signal came finishes"
    running.thread.join(timeout=30)
    assert not running.thread.is_alive() and not running.service.engine._thread.is_alive()


def test_curl_sees_the_raw_sse_framing(tiny):
    body = json.dumps({"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 8, "temperature": 0, "stream": True,
                       "return_token_ids": True})
    out = subprocess.run(["curl", "-sN", "-H", "Content-Type: application/json", "-d", body,
                          tiny.url + "/v1/completions"], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.endswith("\n\ndata: [DONE]\n\n")
    events = out.stdout.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"} and len({c["id"] for c in chunks}) == 1
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == _greedy([1, 2, 3], 8)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_vllms_metric_names_are_exposed(tiny):
    _ids(tiny.client(), [1, 2, 3], 8)
    names = {name for name, _ in tiny.metrics()}
    for want in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
                 "vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert want in names, want
    assert not [n for n in names if n.endswith("_created")], "no _created series beside each counter, as vLLM"
    m = tiny.metrics()
    assert m[("vllm:spec_decode_num_draft_tokens_total", ())] >= m[("vllm:spec_decode_num_accepted_tokens_total", ())]
    per_pos = sum(v for (n, _), v in m.items() if n == "vllm:spec_decode_num_accepted_tokens_per_pos_total")
    assert per_pos == m[("vllm:spec_decode_num_accepted_tokens_total", ())]


@pytest.mark.slow
def test_default_pair_greedy_chat_equals_autoregressive_decoding_streamed_and_not():
    pair = sl.load_default_pair()
    server = Server(pair.target, pair.draft, max_batch=4, max_seq_len=512, k=4)
    running = Running(Service(server, "SmolLM2-135M-Instruct"))
    try:
        client = running.client()
        messages = [{"role": "system", "content": "You are brief."},
                    {"role": "user", "content": "Name three primary colours."}]
        ids = pair.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = list(ids if isinstance(ids, list) else ids["input_ids"])
        want = sl.autoregressive_generate(pair.target, ids, max_new_tokens=32)
        args = dict(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=32, temperature=0)
        r = client.chat.completions.create(extra_body={"return_token_ids": True}, **args)
        assert r.choices[0].token_ids == want.tokens and r.choices[0].message.content == want.text
        assert r.usage.prompt_tokens == len(ids)
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **args)
                       if c.choices)
        assert text == want.text
        mid = len(want.text) // 2
        stop = want.text[mid:mid + 3]  # a stop string spanning tokens, most likely
        cut = want.text[:want.text.find(stop)]
        r = client.chat.completions.create(stop=[stop, "\u2603never"], **args)
        assert (r.choices[0].message.content, r.choices[0].finish_reason) == (cut, "stop")
        chunks = [c for c in client.chat.completions.create(stream=True, stop=stop, **args) if c.choices]
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == cut
        assert chunks[-1].choices[0].finish_reason == "stop"
        # the stream's last chunk goes out as the cancel is handed to the engine thread, so wait for it
        _eventually(running, ("vllm:request_success_total", (("finished_reason", "stop"),)), 2)
    finally:
        running.stop()


def test_ignore_eos_decodes_through_the_end_of_sequence_to_max_tokens():
    """vLLM's ignore_eos, which its load generator sends with random prompts: a target whose first greedy
    token is its EOS stops at once without it, and with it answers max_tokens tokens, the same as the
    target with no EOS at all; a bad value is a 400 naming the field."""
    prompt = [5, 6, 7]
    first = _greedy(prompt, 1)[0]
    target = sl.tiny_model(0, eos_token_ids=(first,))
    running = Running(_service(target=target))
    try:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0, "return_token_ids": True}
        stopped = httpx.post(running.url + "/v1/completions", json=body).json()["choices"][0]
        assert stopped["token_ids"] == [first] and stopped["finish_reason"] == "stop"
        through = httpx.post(running.url + "/v1/completions", json=body | {"ignore_eos": True}).json()["choices"][0]
        assert through["token_ids"] == _greedy(prompt, 12) and through["finish_reason"] == "length"
        r = httpx.post(running.url + "/v1/completions", json=body | {"ignore_eos": "yes"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "ignore_eos"
    finally:
        running.stop()
