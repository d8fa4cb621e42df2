"""The lab's Server as an OpenAI-compatible HTTP service.

protocol (OpenAI's request and response shapes, checked), detok (text as tokens arrive, stop strings),
loop (the engine thread, the one thread that touches the Server), metrics (/metrics under vLLM's names),
app (the ASGI app on Starlette, and `run` on uvicorn).
"""
from .app import Service, build_app, http_server, run
from .loop import Busy, Closed, EngineLoop
from .protocol import ApiError, GenRequest, parse_request

__all__ = ["Service", "build_app", "http_server", "run", "Busy", "Closed", "EngineLoop", "ApiError", "GenRequest",
           "parse_request"]
