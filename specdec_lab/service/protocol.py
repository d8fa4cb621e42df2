"""OpenAI's request and response shapes: a request body checked into a GenRequest, and the bodies sent back.

Everything is checked before anything is queued; a bad body raises ApiError naming the field, its value
and what is allowed, which the app answers in OpenAI's error shape. Fields the lab does not support are
refused unless they carry their neutral value (a client that sends `presence_penalty: 0` asks for nothing).
"""
import math
import time
import uuid
from dataclasses import dataclass, field

from ..core.config import MAX_K
from ..options.grammar import grammar_text


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status, message, param=None, code=None, kind="invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.param, self.code)


def error_body(message, kind="invalid_request_error", param=None, code=None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def bad(param, message, code=None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


# Fields accepted only at the value that asks for nothing (what an SDK or a load generator may send anyway).
NEUTRAL = {"echo": (False,), "best_of": (None, 1), "logit_bias": (None, {}), "suffix": (None,),
           "tools": (None, []), "tool_choice": (None, "none")}
COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream", "stream_options",
          "user", "return_token_ids", "ignore_eos", "presence_penalty", "frequency_penalty", "repetition_penalty",
          "logprobs", "response_format"}
FIELDS = {False: COMMON | {"prompt"}, True: COMMON | {"messages", "max_completion_tokens", "top_logprobs"}}
LOOKAHEAD = MAX_K + 1  # positions a step may write past the answer (the server's own check counts them)
MAX_N = 8  # answers to one request
MAX_TOP_LOGPROBS = {False: 5, True: 20}  # OpenAI's limits: completions' logprobs, chat's top_logprobs


@dataclass
class GenRequest:
    """A checked request: the prompt's ids and what the Server's submit takes, plus the reply's options."""
    chat: bool
    ids: list
    max_tokens: int
    sampling: dict  # temperature, top_p, top_k, seed, ignore_eos: Server.submit's keywords
    stop: list = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False
    options: dict = field(default_factory=dict)  # grammar, penalties, logprobs: Server.submit's request options
    n: int = 1  # answers, each its own sequence (seed + i for answer i when seeded)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


def parse_request(body, chat, tokenizer, vocab_size, max_seq_len, model_name) -> GenRequest:
    """The body of POST /v1/completions (chat=False) or /v1/chat/completions (chat=True), checked."""
    if not isinstance(body, dict):
        raise bad(None, f"the body must be a JSON object, got {type(body).__name__}")
    _check_fields(body, chat)
    model = body.get("model")
    if model is not None and model != model_name:
        raise ApiError(404, f"model {model!r} is not served here; this server serves {model_name!r} (GET /v1/models)",
                       param="model", code="model_not_found")
    ids = _chat_ids(body.get("messages"), tokenizer) if chat else _prompt_ids(body.get("prompt"), tokenizer)
    _check_ids(ids, vocab_size, "messages" if chat else "prompt", max_seq_len)
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise bad("stream_options", f"stream_options must be {{\"include_usage\": bool}} and goes with stream: "
                                    f"true, got {options!r}")
    room = max_seq_len - len(ids) - LOOKAHEAD
    return GenRequest(chat, ids, _max_tokens(body, chat, room, len(ids), max_seq_len), _sampling(body),
                      _stop(body, tokenizer), stream, bool(options and _bool(options, "include_usage", False)),
                      _bool(body, "return_token_ids", tokenizer is None),  # without a tokenizer, ids are the answer
                      _request_options(body, chat, tokenizer), _n(body))


def _check_fields(body, chat):
    allowed = FIELDS[chat]
    for name, value in body.items():
        if name in allowed:
            continue
        if name in NEUTRAL and any(value == v and type(value) is type(v) for v in NEUTRAL[name]):
            continue
        what = (f"only at its neutral value ({' or '.join(repr(v) for v in NEUTRAL[name])})" if name in NEUTRAL
                else "not at all")
        raise bad(name, f"{name} = {value!r} is not supported here ({what}); supported fields: "
                        f"{', '.join(sorted(allowed))}", code="unsupported_parameter")
    if chat and "messages" not in body:
        raise bad("messages", "messages is required: a list of {role, content}")
    if not chat and "prompt" not in body:
        raise bad("prompt", "prompt is required: a string or a list of token ids")


def _n(body) -> int:
    n = body.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise bad("n", f"n must be an int in [1, {MAX_N}] (answers to the request), got {n!r}")
    return n


def _request_options(body, chat, tokenizer) -> dict:
    """Penalties, logprobs and response_format as the Server's request options (options/)."""
    out = {"presence_penalty": float(_number(body, "presence_penalty", 0.0, -2, 2)),
           "frequency_penalty": float(_number(body, "frequency_penalty", 0.0, -2, 2))}
    rep = _number(body, "repetition_penalty", 1.0, 0, 10)
    if rep == 0:
        raise bad("repetition_penalty", "repetition_penalty must be in (0, 10] (1 for none), got 0")
    out["repetition_penalty"] = float(rep)
    top = MAX_TOP_LOGPROBS[chat]
    if chat:  # logprobs: bool; top_logprobs: 0..20, with logprobs true
        out["logprobs"] = _bool(body, "logprobs", False)
        k = body.get("top_logprobs")
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= top:
                raise bad("top_logprobs", f"top_logprobs must be an int in [0, {top}], got {k!r}")
            if not out["logprobs"]:
                raise bad("top_logprobs", "top_logprobs needs logprobs: true")
            out["top_logprobs"] = k
    else:  # the completions API's logprobs: null, or how many most likely tokens to list beside each (0..5)
        k = body.get("logprobs")
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= top:
                raise bad("logprobs", f"logprobs must be null or an int in [0, {top}], got {k!r}")
            out["logprobs"], out["top_logprobs"] = True, k
    grammar = _response_format(body.get("response_format"))
    if grammar is not None:
        if tokenizer is None:
            raise bad("response_format", "response_format needs text: this server's model has no tokenizer")
        out["grammar"] = grammar
    return out


def _response_format(fmt):
    """OpenAI's response_format as a grammar (options/grammar.py), or None for free text."""
    if fmt is None or fmt == {"type": "text"}:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad("response_format", f"response_format must be {{type: text | json_object | json_schema}}, "
                                     f"got {_short(fmt)}")
    if fmt["type"] == "json_object" and set(fmt) == {"type"}:
        return "json"
    spec = fmt.get("json_schema")
    if fmt["type"] != "json_schema" or set(fmt) != {"type", "json_schema"} or not isinstance(spec, dict) \
            or not isinstance(spec.get("schema"), dict) or set(spec) - {"name", "schema", "strict", "description"}:
        raise bad("response_format", f"response_format json_schema must be {{type: json_schema, json_schema: "
                                     f"{{name, schema: {{...}}, strict?, description?}}}}, got {_short(fmt)}")
    try:
        grammar_text(spec["schema"])
    except ValueError as err:
        raise bad("response_format", f"response_format.json_schema.schema: {err}") from None
    return spec["schema"]


def _prompt_ids(prompt, tokenizer) -> list:
    """A completion's prompt: a string, a list of token ids, or a list holding one of those (OpenAI's batch
    form with one element)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad("prompt", "prompt must not be empty")
        if tokenizer is None:
            raise bad("prompt", "this server's model has no tokenizer: send the prompt as a list of token ids")
        return list(tokenizer.encode(prompt))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise bad("prompt", f"prompt must be a non-empty string or list of token ids (one prompt per request), "
                        f"got {_short(prompt)}")


def _chat_ids(messages, tokenizer) -> list:
    if not isinstance(messages, list) or not messages:
        raise bad("messages", f"messages must be a non-empty list of {{role, content}}, got {_short(messages)}")
    turns = [_message(i, m) for i, m in enumerate(messages)]
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise bad("messages", "messages need a chat template, and this server's model has none: use "
                              "/v1/completions with token ids")
    ids = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def _message(i, m) -> dict:
    where = f"messages[{i}]"
    roles, keys = ("system", "user", "assistant"), {"role", "content", "name"}
    if not isinstance(m, dict) or m.get("role") not in roles or set(m) - keys:
        raise bad(where, f"{where} must be {{role: system|user|assistant, content}}, got {_short(m)}")
    content = m.get("content")
    if isinstance(content, list):  # the parts form: [{"type": "text", "text": ...}, ...]
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise bad(f"{where}.content", f"{where}.content parts must all be {{type: text, text}} (text only)")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise bad(f"{where}.content", f"{where}.content must be a string, got {_short(content)}")
    return {"role": m["role"], "content": content}


def _check_ids(ids, vocab_size, param, max_seq_len):
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise bad(param, f"{param}: token ids must be in [0, {vocab_size}), got min {min(ids)}, max {max(ids)}")
    most = max_seq_len - LOOKAHEAD - 1
    if len(ids) > most:
        raise bad(param, f"{param}: the prompt is {len(ids)} tokens; this server holds {max_seq_len} positions, "
                         f"so at most {most} prompt tokens (one new token and a step's lookahead of {LOOKAHEAD} "
                         f"must fit)",
                  code="context_length_exceeded")


def _max_tokens(body, chat, room, prompt_len, max_seq_len) -> int:
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    value = body.get(name)
    if value is None:  # OpenAI's default for completions is 16; a chat answer may fill what is left
        return min(16, room) if not chat else room
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad(name, f"{name} must be an int >= 1, got {value!r}")
    if value > room:
        raise bad(name, f"{name} = {value}: the prompt's {prompt_len} tokens + {value} + a step's lookahead of "
                        f"{LOOKAHEAD} exceed this server's {max_seq_len} positions; at most {room}",
                  code="context_length_exceeded")
    return value


def _sampling(body) -> dict:
    t = _number(body, "temperature", 1.0, 0, 2)
    if 0 < t < 1e-5:  # below it the logits overflow float32 (the engines refuse it too)
        raise bad("temperature", f"temperature must be 0 (greedy) or at least 1e-5, got {t!r}")
    top_p = _number(body, "top_p", 1.0, 0, 1)
    if top_p == 0:
        raise bad("top_p", "top_p must be in (0, 1], got 0")
    top_k = body.get("top_k", 0)
    if top_k is None:
        top_k = 0
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1:
        raise bad("top_k", f"top_k must be an int: -1 or 0 for all tokens, or k >= 1, got {top_k!r}")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not -2**63 <= seed < 2**63):
        raise bad("seed", f"seed must be an int in [-2^63, 2^63) or null, got {seed!r}")
    # ignore_eos (vLLM's extension): decode through EOS to max_tokens, as load generators ask for fixed lengths
    return {"temperature": float(t), "top_p": float(top_p), "top_k": max(top_k, 0), "seed": seed,
            "ignore_eos": _bool(body, "ignore_eos", False)}


def _number(body, name, default, lo, hi):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise bad(name, f"{name} must be a number in [{lo}, {hi}], got {v!r}")
    return v


def _bool(body, name, default):
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(name, f"{name} must be true or false, got {v!r}")
    return v


def _stop(body, tokenizer) -> list:
    stop = body.get("stop")
    if stop is None or stop == []:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not 1 <= len(stops) <= 4 or not all(isinstance(s, str) and s for s in stops):
        raise bad("stop", f"stop must be a non-empty string or a list of 1 to 4 of them, got {_short(stop)}")
    if tokenizer is None:
        raise bad("stop", "stop strings need text: this server's model has no tokenizer")
    return stops


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- replies -------------------------------------------------------------------------

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}  # the server's reasons in OpenAI's words


def usage(req, completion_tokens) -> dict:
    n = len(req.ids)
    return {"prompt_tokens": n, "completion_tokens": completion_tokens, "total_tokens": n + completion_tokens}


def logprobs_body(req, tokenizer, entries, text_start=0):
    """OpenAI's logprobs for these tokens (options.Logprobs' entries), or None where the request asked for
    none: chat's {"content": [{token, logprob, bytes, top_logprobs}], "refusal"}, the completions API's
    {tokens, token_logprobs, top_logprobs, text_offset} (offsets from `text_start` characters)."""
    if not req.options.get("logprobs"):
        return None

    def text(t):
        return tokenizer.decode([t]) if tokenizer is not None else str(t)

    if req.chat:
        return {"content": [{"token": text(e["token"]), "logprob": e["logprob"], "bytes": list(text(e["token"]).encode()),
                             "top_logprobs": [{"token": text(t), "logprob": v, "bytes": list(text(t).encode())}
                                              for t, v in e["top"]]} for e in entries], "refusal": None}
    tokens, offsets = [text(e["token"]) for e in entries], []
    for t in tokens:
        offsets.append(text_start)
        text_start += len(t)
    return {"tokens": tokens, "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{text(t): v for t, v in e["top"]} for e in entries], "text_offset": offsets}


def completion_body(req, model, answers, tokenizer=None) -> dict:
    """answers: (text, token ids, reason, logprob entries) per choice, in index order."""
    choices = []
    for index, (text, token_ids, reason, entries) in enumerate(answers):
        choice = {"index": index, "finish_reason": FINISH[reason], "logprobs": logprobs_body(req, tokenizer, entries)}
        if req.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if req.return_token_ids:  # vLLM's extension: the ids themselves, for clients that check tokens
            choice["token_ids"], choice["prompt_token_ids"] = list(token_ids), list(req.ids)
        choices.append(choice)
    kind = "chat.completion" if req.chat else "text_completion"
    return {"id": _id(req), "object": kind, "created": req.created, "model": model, "choices": choices,
            "usage": usage(req, sum(len(a[1]) for a in answers))}


def chunk_body(req, model, text=None, token_ids=(), reason=None, role=False, index=0, logprobs=None) -> dict:
    """One streamed chunk of choice `index`: a delta of text (and ids, and their logprobs), or the last one
    with its finish_reason."""
    choice = {"index": index, "finish_reason": FINISH[reason] if reason else None, "logprobs": logprobs}
    if req.chat:
        delta = {"role": "assistant", "content": ""} if role else {}
        if text:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    if req.return_token_ids:
        choice["token_ids"] = list(token_ids)
    return _chunk(req, model, [choice])


def usage_chunk(req, model, completion_tokens) -> dict:
    return _chunk(req, model, [], usage(req, completion_tokens))


def _chunk(req, model, choices, usage_=None) -> dict:
    kind = "chat.completion.chunk" if req.chat else "text_completion"
    body = {"id": _id(req), "object": kind, "created": req.created, "model": model, "choices": choices}
    if usage_ is not None:
        body["usage"] = usage_
    return body


def _id(req) -> str:
    return ("chatcmpl-" if req.chat else "cmpl-") + req.id
