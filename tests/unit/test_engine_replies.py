"""Engine ErrorResponse translation and SSE framing (shapes as vLLM/ray.serve.llm yield them)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from pydantic import BaseModel

from router.errors import ContextLengthExceeded, InvalidRequest, ModelNotFound, TargetUnavailable, UpstreamError
from serve_apps.engine.replies import is_error_response, to_sse, translate_error_response


def _error(message: str, code: int, param: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(error=SimpleNamespace(message=message, type="BadRequestError", param=param, code=code))


@pytest.mark.parametrize(
    ("message", "code", "cls", "status"),
    [
        (
            "This model's maximum context length is 4096 tokens. However, your prompt contains at least 4097 "
            "input tokens",
            400,
            ContextLengthExceeded,
            400,
        ),
        ("max_tokens=3000 cannot be greater than max_model_len=2048.", 400, ContextLengthExceeded, 400),
        ("temperature must be non-negative", 400, InvalidRequest, 400),
        ("The model `x` does not exist.", 404, ModelNotFound, 404),
        ("engine overloaded", 503, TargetUnavailable, 503),
        ("engine dead", 500, UpstreamError, 502),
    ],
)
def test_translate(message: str, code: int, cls: type, status: int) -> None:
    err = translate_error_response(_error(message, code, "input_tokens"))
    assert type(err) is cls
    assert err.status_code == status
    assert err.message == message


def test_shape_detection() -> None:
    assert is_error_response(_error("x", 400))
    assert not is_error_response(SimpleNamespace(choices=[]))
    assert not is_error_response("data: {}\n\n")


class Chunk(BaseModel):
    id: str
    delta: str


def test_to_sse_framing() -> None:
    assert to_sse("data: a\n\n") == "data: a\n\n"
    assert to_sse([Chunk(id="1", delta="Pa"), "data: b\n\n"]) == 'data: {"id":"1","delta":"Pa"}\n\ndata: b\n\n'
    error_event = to_sse(_error("too long: maximum context length is 10", 400))
    assert json.loads(error_event[6:])["error"]["code"] == "context_length_exceeded"
    with pytest.raises(UpstreamError):
        to_sse(object())


def test_an_error_event_of_the_engine_is_an_error_not_text() -> None:
    """What vLLM's OpenAI server streamed when its engine core was killed mid-answer (measured): the
    gateway raises it, so the stream ends with the gateway's own error event, or continues elsewhere."""
    from serve_apps.engine.replies import error_in_events

    died = (
        'data: {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root '
        'cause.", "type": "InternalServerError", "param": null, "code": 500}}\n\n'
    )
    error = error_in_events(died)
    assert isinstance(error, UpstreamError) and error.code == "upstream_error" and "EngineCore" in error.message
    content = 'data: {"choices": [{"index": 0, "delta": {"content": "an \\"error\\": {} here"}}]}\n\n'
    assert error_in_events(content) is None  # the word in an answer is not an error event
    assert error_in_events("data: [DONE]\n\n") is None
    bad = 'data: {"error": {"message": "too long", "code": 400}}\n\n'
    assert isinstance(error_in_events(bad), InvalidRequest)
