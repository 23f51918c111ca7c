"""Engine replies (ray.serve.llm LLMServer stream items) as spillover values.

Pure functions, no Ray import: the one place that maps the engine's `ErrorResponse` to
`router.errors` classes and turns stream items into SSE event text. The replica hands the gateway
plain values (`plain`: strings, `EngineError`, `Complete`), never vLLM's own classes: unpickling one
would import vLLM and torch into the gateway (10 s and 500 MB a replica, measured), which needs neither.
The same holds for what the replica raises (`engine_failed`): Ray hands a raised exception to the caller
as itself, so an engine's own (vLLM's `EngineDeadError`, say) would import vLLM there too — measured, a
gateway whose engine died took in and sent out nothing for 10 s while Ray unpickled it on its IO thread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from router.error_codes import ErrorCode
from router.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    ModelNotFound,
    RequestError,
    TargetUnavailable,
    UpstreamError,
)

DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class ErrorDetail:
    message: str
    code: int
    param: str | None = None


@dataclass(frozen=True)
class EngineError:
    """An engine `ErrorResponse` (or a body the engine's request class refused), in the same shape."""

    error: ErrorDetail


@dataclass(frozen=True)
class Complete:
    """A whole (not streamed) answer, as its JSON body."""

    body: dict[str, Any]


class EngineFailed(RuntimeError):
    """An exception the engine raised, as its class name and message (`engine_failed`)."""


def engine_failed(exc: Exception) -> EngineFailed:
    """`exc` as an exception the gateway unpickles without importing vLLM: raise it `from None`, so the
    original travels neither as its cause nor as its context."""
    return EngineFailed(f"{type(exc).__name__}: {exc}"[:1000])


def invalid_body(exc: ValidationError) -> EngineError:
    """A request body the engine's request class refused: a 400 naming the first field at fault."""
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    return EngineError(ErrorDetail(f"invalid request: {param}: {first['msg']}", 400, param))


def error_detail(error: Any) -> ErrorDetail:
    """The message, status and parameter of an engine `ErrorResponse` (or of its `.error`, or an `EngineError`)."""
    info = getattr(error, "error", error)
    code = getattr(info, "code", 500)
    try:
        status = int(code or 500)
    except (TypeError, ValueError):
        status = 500
    param = getattr(info, "param", None)
    message = str(getattr(info, "message", "") or "the engine rejected the request")
    return ErrorDetail(message, status, None if param is None else str(param))


def plain(item: Any) -> Any:
    """A stream item of the engine's (SSE text, a list of them, an `ErrorResponse`, a whole response) in
    plain values the gateway unpickles without importing vLLM."""
    if isinstance(item, str):
        return item
    if isinstance(item, list):
        return [plain(part) for part in item]
    if is_error_response(item):
        return EngineError(error_detail(item))
    if hasattr(item, "model_dump"):
        return Complete(item.model_dump(mode="json", exclude_none=True))
    return item


def translate_error_response(error: Any) -> RequestError:
    """An engine `ErrorResponse` (or its `.error`) as a spillover error."""
    detail = error_detail(error)
    message, status, param = detail.message, detail.code, detail.param
    if status == 400:
        lowered = message.lower()
        if "context length" in lowered or "max_model_len" in lowered or "maximum context" in lowered:
            return ContextLengthExceeded(message, param=param)
        return InvalidRequest(message, param=param)
    if status == 404:
        return ModelNotFound(message, param=param)
    if status in (503, 429):
        return TargetUnavailable(message)
    return UpstreamError(message)


def is_error_response(item: Any) -> bool:
    """True for the engine's `ErrorResponse` (LLMServer yields the internal class, not
    the public `ray.serve.llm.openai_api_models` subclass, so match by shape)."""
    error = getattr(item, "error", None)
    return error is not None and hasattr(error, "message") and hasattr(error, "code")


def error_in_events(text: str) -> RequestError | None:
    """The error an SSE text from the engine carries in one of its events, or None. vLLM's OpenAI server
    reports a failure after a stream started (its engine died, say) as an event of its own, in its own
    shape (`{"error": {"message": ..., "code": 500}}`); the gateway ends streams its own way instead."""
    if '"error"' not in text:
        return None
    for line in text.split("\n"):
        if not line.startswith("data:"):
            continue
        try:
            payload = json.loads(line[5:])
        except ValueError:
            continue
        if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
            info = payload["error"]
            message = str(info.get("message") or "the engine failed while streaming")[:300]
            status = info.get("code")
            if isinstance(status, int) and 400 <= status < 500 and status != 429:
                return InvalidRequest(message)
            return UpstreamError(f"the engine failed mid-stream: {message}", code=ErrorCode.UPSTREAM_ERROR)
    return None


def to_sse(item: Any) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, list):
        return "".join(to_sse(part) for part in item)
    if is_error_response(item):
        return f"data: {json.dumps(translate_error_response(item).to_openai())}\n\n"
    if isinstance(item, Complete):
        return f"data: {json.dumps(item.body)}\n\n"
    if hasattr(item, "model_dump_json"):
        return f"data: {item.model_dump_json()}\n\n"
    raise UpstreamError(f"unexpected stream item from the engine: {type(item).__name__}")
