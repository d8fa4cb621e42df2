"""The ASGI app: OpenAI's completions and chat completions over a Server, with /v1/models, /health, /metrics.

    service = Service(Server(target, draft, max_batch=8), model_name="SmolLM2-135M-Instruct")
    run(service, host="127.0.0.1", port=8000)             # uvicorn; SIGINT/SIGTERM end it gracefully

Handlers only check, submit, await and stream: the model belongs to the engine thread (loop.py). Each
request gets an asyncio queue that the engine thread fills with loop.call_soon_threadsafe; a client that
goes away cancels its request, whose blocks return to the pool between two steps.
"""
import asyncio
import contextlib
import errno
import functools
import hmac
import json
import socket

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .detok import Detokenizer
from .loop import Busy, Closed, EngineLoop
from .metrics import CONTENT_TYPE_LATEST, ServiceMetrics
from .protocol import (ApiError, bad, chunk_body, completion_body, error_body, logprobs_body, parse_request,
                       usage_chunk)

BODY_LIMIT = 1 << 20  # bytes: a prompt the server can hold is far smaller


class Service:
    """What the handlers share: the engine thread, the metrics, the model's name and limits."""

    def __init__(self, server, model_name, max_waiting=64, api_key=None, body_limit=BODY_LIMIT):
        if api_key is not None and (not isinstance(api_key, str) or not api_key):
            raise ValueError(f"api_key must be a non-empty string or None, got {api_key!r}")
        self.server, self.model_name, self.api_key, self.body_limit = server, model_name, api_key, body_limit
        self.metrics = ServiceMetrics(server, model_name)
        self.engine = EngineLoop(server, max_waiting, self.metrics)
        self.tokenizer = server.tokenizer
        self.vocab_size = server.engine.target.cfg.vocab_size
        self.max_seq_len = server.engine.max_seq_len


def build_app(service) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.engine.start()
        yield
        await asyncio.to_thread(service.engine.stop)

    routes = [Route("/v1/completions", _api(service, lambda r: _generate(service, r, chat=False)), methods=["POST"]),
              Route("/v1/chat/completions", _api(service, lambda r: _generate(service, r, chat=True)),
                    methods=["POST"]),
              Route("/v1/models", _api(service, lambda r: _models(service)), methods=["GET"]),
              Route("/health", functools.partial(_health, service), methods=["GET"]),
              Route("/metrics", functools.partial(_metrics, service), methods=["GET"])]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={404: _unknown_route, 405: _unknown_route})


ROUTES = "POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health and GET /metrics"


async def _unknown_route(request, exc):
    """A path or a method this server does not serve, answered in OpenAI's error shape (a client's SDK reads
    the message from there) rather than as plain text."""
    what = "no such route" if exc.status_code == 404 else "this method is not allowed here"
    return JSONResponse(error_body(f"{what}: {request.method} {request.url.path}; this server answers {ROUTES}",
                                   code="not_found" if exc.status_code == 404 else "method_not_allowed"),
                        status_code=exc.status_code, headers=getattr(exc, "headers", None))


def check_port_free(host, port):
    """OSError naming the address where another process already listens on it: said before the models load
    and before "serving ...", not after uvicorn's startup lines."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            why = ("another process listens there; choose another --port, or 0 for any free one"
                   if e.errno == errno.EADDRINUSE else "check --host and --port")
            raise OSError(e.errno, f"--host {host} --port {port} cannot be served: {e.strerror} ({why})") from None


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, which on SIGINT/SIGTERM also stops the engine admitting (503) before it waits
    for the requests in flight; what is still running after the grace period is cancelled."""

    def __init__(self, config, service):
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig, frame):
        self.service.engine.close()
        super().handle_exit(sig, frame)


def http_server(service, host="127.0.0.1", port=8000, grace_seconds=30.0, log_level="info") -> uvicorn.Server:
    """The uvicorn server of `service`, not started: `.run()` (or `.run(sockets=[...])`) serves until
    SIGINT/SIGTERM or `should_exit`."""
    config = uvicorn.Config(build_app(service), host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=grace_seconds)
    return _Uvicorn(config, service)


def run(service, host="127.0.0.1", port=8000, grace_seconds=30.0, log_level="info"):
    """Serve until SIGINT or SIGTERM, then shut down gracefully."""
    try:
        http_server(service, host, port, grace_seconds, log_level).run()
    except KeyboardInterrupt:  # uvicorn raises the SIGINT it handled again once its shutdown is done
        pass


# -- handlers --------------------------------------------------------------------------

def _api(service, fn):
    """An /v1 handler: the API key first (nothing runs without it), ApiError answered in OpenAI's shape."""
    async def handler(request):
        try:
            _authorize(service, request)
            return await fn(request)
        except ApiError as err:
            return JSONResponse(err.body(), status_code=err.status)
    return handler


def _authorize(service, request):
    if service.api_key is None:
        return
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {service.api_key}".encode()):
        raise ApiError(401, "a valid API key is required: Authorization: Bearer KEY", code="invalid_api_key")


async def _models(service):
    return JSONResponse({"object": "list", "data": [{"id": service.model_name, "object": "model", "created": 0,
                                                     "owned_by": "specdec_lab",
                                                     "max_model_len": service.max_seq_len}]})


async def _health(service, request):
    ok = service.engine.accepting
    return JSONResponse({"status": "ok" if ok else "shutting down"}, status_code=200 if ok else 503)


async def _metrics(service, request):
    return Response(service.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


async def _read_json(request, limit):
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, f"the body is {length} bytes; this server takes at most {limit}", code="body_too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"the body is over {limit} bytes, the most this server takes", code="body_too_large")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise bad(None, f"the body is not valid JSON: {err}", code="invalid_json") from None


async def _generate(service, request, chat):
    body = await _read_json(request, service.body_limit)
    req = parse_request(body, chat, service.tokenizer, service.vocab_size, service.max_seq_len, service.model_name)
    replies = [_Reply(asyncio.get_running_loop()) for _ in range(req.n)]  # n answers: n sequences
    handles = await _submit(service, req, replies)
    answers = [_Answer(service, req, handle, reply) for handle, reply in zip(handles, replies)]
    if req.stream:
        return _Stream(_sse(service, req, answers), answers)
    return await _whole(service, request, req, answers)


async def _submit(service, req, replies):
    """The request's n sequences, queued together (their prompt is read once); answer i is seeded with
    seed + i. Returns their handles."""
    requests = []
    for index, reply in enumerate(replies):
        sampling = dict(req.sampling, max_new_tokens=req.max_tokens, **req.options)
        if index and sampling.get("seed") is not None:
            sampling["seed"] = (sampling["seed"] + index + 2**63) % 2**64 - 2**63  # stays a signed 64-bit seed
        requests.append((req.ids, reply.on_tokens, reply.on_done, sampling))
    future = service.engine.submit_all(requests)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:  # the client left while the requests were queued: cancel them once they are
        def cancel_queued(f):
            if not f.cancelled() and f.exception() is None:
                for handle in f.result():
                    service.engine.cancel(handle)
        future.add_done_callback(cancel_queued)
        raise
    except Busy as err:
        raise ApiError(429, str(err), code="too_many_requests", kind="rate_limit_error") from None
    except Closed as err:
        raise ApiError(503, str(err), code="shutting_down", kind="server_error") from None
    except ValueError as err:  # the Server's own checks (the engine's limits, the grammar against the tokenizer)
        raise bad("response_format" if str(err).startswith("grammar") else None, str(err)) from None


class _Stream(StreamingResponse):
    """Server-sent events whose request is cancelled however the response ends: a reader gone before the
    first chunk included (then the events' generator never started, and its own finally never runs)."""

    def __init__(self, events, answers):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.answers = answers

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            for answer in self.answers:
                answer.cancel()


class _Reply:
    """The engine thread's side of one request: new tokens and the end, into this event loop's queue."""

    def __init__(self, loop):
        self.loop, self.queue = loop, asyncio.Queue()

    def on_tokens(self, new):
        self.loop.call_soon_threadsafe(self.queue.put_nowait, new)

    def on_done(self, handle):
        self.loop.call_soon_threadsafe(self.queue.put_nowait, None)


class _Answer:
    """One answer as it arrives: (text, ids) deltas cut at a stop string, then how it ended; `entries`,
    the logprobs of its ids where the request asked for them."""

    def __init__(self, service, req, handle, reply):
        self.service, self.handle, self.reply = service, handle, reply
        self.detok = Detokenizer(service.tokenizer, req.stop)
        self.ids, self.reason = [], None

    @property
    def entries(self):
        return (self.handle.logprobs or [])[:len(self.ids)]

    def result(self):
        return self.detok.text, self.ids, self.reason, self.entries

    async def deltas(self):
        while (new := await self.reply.queue.get()) is not None:
            text = self.detok.add(new)
            self.ids += new
            yield text, new
            if self.detok.stopped:  # the answer is complete; the request's blocks can go
                self.service.engine.cancel(self.handle, reason="stop")
                self.reason = "stop"
                return
        self.reason = _ended(self.handle)
        tail = self.detok.flush()
        if tail:
            yield tail, []

    def cancel(self):
        if not self.handle.done:
            self.service.engine.cancel(self.handle)


def _ended(handle) -> str:
    if handle.status == "finished":
        return handle.finish_reason
    if handle.status == "failed":
        raise ApiError(500, f"the request failed: {handle.error!r}", code="request_failed", kind="server_error")
    raise ApiError(503, "the request was cancelled: the server is shutting down", code="shutting_down",
                   kind="server_error")


async def _whole(service, request, req, answers):
    """The non-streamed reply; a client that goes away first cancels the request."""
    async def collect():
        async def one(answer):
            async for _ in answer.deltas():
                pass
        await asyncio.gather(*(one(a) for a in answers))

    work, gone = asyncio.ensure_future(collect()), asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not work.done():
        work.cancel()
        for answer in answers:
            answer.cancel()
        return Response(status_code=499)  # nobody reads it
    work.result()  # an ApiError of a failed request
    return JSONResponse(completion_body(req, service.model_name, [a.result() for a in answers], service.tokenizer))


async def _disconnected(request):
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _sse(service, req, answers):
    """Server-sent events in OpenAI's chunk shape, ending with data: [DONE]; an error mid-way is one
    error event. With n answers, each chunk carries its choice's index, in the order they arrive. The
    reader going away (this generator cancelled or closed) cancels the request."""
    model, events, tasks = service.model_name, asyncio.Queue(), []

    async def pump(index, answer):  # one answer's chunks into the shared queue; None when it ends
        try:
            sent, chars = 0, 0
            async for text, ids in answer.deltas():
                if text or ids or req.return_token_ids:
                    entries = answer.entries[sent:]
                    logprobs = logprobs_body(req, service.tokenizer, entries, chars)
                    sent, chars = sent + len(entries), chars + len(text)
                    if text or req.return_token_ids or logprobs is not None:
                        await events.put(chunk_body(req, model, text, ids, index=index, logprobs=logprobs))
            await events.put(chunk_body(req, model, reason=answer.reason, index=index))
        except ApiError as err:
            await events.put(err)
        finally:
            await events.put(None)

    try:
        if req.chat:
            for index in range(len(answers)):
                yield _event(chunk_body(req, model, role=True, index=index))
        tasks = [asyncio.ensure_future(pump(i, a)) for i, a in enumerate(answers)]
        running = len(tasks)
        while running:
            item = await events.get()
            if item is None:
                running -= 1
            elif isinstance(item, ApiError):
                raise item
            else:
                yield _event(item)
        if req.include_usage:
            yield _event(usage_chunk(req, model, sum(len(a.ids) for a in answers)))
    except ApiError as err:
        yield _event(err.body())
    finally:
        for task in tasks:
            task.cancel()
        for answer in answers:
            answer.cancel()
    yield "data: [DONE]\n\n"


def _event(doc) -> str:
    return f"data: {json.dumps(doc)}\n\n"
