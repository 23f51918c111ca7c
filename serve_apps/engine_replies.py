"""Engine replies (ray.serve.llm LLMServer stream items) as spillover values.

Pure functions, no Ray import: the one place that maps the engine's `ErrorResponse` to
`router.errors` classes and turns stream items into SSE event text.
"""

from __future__ import annotations

import json
from typing import Any

from router.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    ModelNotFound,
    RequestError,
    TargetUnavailable,
    UpstreamError,
)

DONE = "data: [DONE]\n\n"


def translate_error_response(error: Any) -> RequestError:
    """An engine `ErrorResponse` (or its `.error`) as a spillover error."""
    info = getattr(error, "error", error)
    message = str(getattr(info, "message", "") or "the engine rejected the request")
    status = int(getattr(info, "code", 500) or 500)
    param = getattr(info, "param", None)
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


def to_sse(item: Any) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, list):
        return "".join(to_sse(part) for part in item)
    if is_error_response(item):
        return f"data: {json.dumps(translate_error_response(item).to_openai())}\n\n"
    if hasattr(item, "model_dump_json"):
        return f"data: {item.model_dump_json()}\n\n"
    raise UpstreamError(f"unexpected stream item from the engine: {type(item).__name__}")
