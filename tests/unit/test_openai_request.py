"""Request parsing: every user mistake becomes a RequestError with the right status."""

from __future__ import annotations

import json

import pytest

from router.errors import InvalidRequest, ModelNotFound
from router.request.openai_request import ModelLimits, parse_body, resolve_model

MODELS = {"a": ModelLimits("a", 1024), "b": ModelLimits("b", None)}


def _raw(body: object) -> bytes:
    return json.dumps(body).encode()


def test_valid_chat() -> None:
    parsed = parse_body(_raw({"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}), "chat")
    assert (parsed.model, parsed.stream, parsed.max_tokens) == ("a", False, 5)
    assert resolve_model(parsed, MODELS).alias == "a"


def test_max_completion_tokens_preferred() -> None:
    body = {"model": "a", "messages": [{"role": "user"}], "max_completion_tokens": 7, "max_tokens": 9}
    assert parse_body(_raw(body), "chat").max_tokens == 7


@pytest.mark.parametrize(
    ("raw", "kind", "param", "code"),
    [
        (b"{not json", "chat", None, "invalid_json"),
        (b"\xff\xfe", "chat", None, "invalid_json"),
        (b"[1, 2]", "chat", None, "invalid_json"),
        (_raw({"messages": [{"role": "user"}]}), "chat", "model", "invalid_request"),
        (_raw({"model": "a"}), "chat", "messages", "invalid_request"),
        (_raw({"model": "a", "messages": []}), "chat", "messages", "invalid_request"),
        (_raw({"model": "a", "messages": ["hi"]}), "chat", "messages[0]", "invalid_request"),
        (_raw({"model": "a", "messages": [{"role": "user"}], "stream": "yes"}), "chat", "stream", "invalid_request"),
        (
            _raw({"model": "a", "messages": [{"role": "user"}], "max_tokens": 0}),
            "chat",
            "max_tokens",
            "invalid_request",
        ),
        (_raw({"model": "a", "messages": [{"role": "user"}], "max_tokens": True}), "chat", "max_tokens", None),
        (_raw({"model": "a"}), "completions", "prompt", "invalid_request"),
        (_raw({"model": "a", "prompt": "x", "echo": "yes"}), "completions", "echo", "invalid_request"),
        (_raw({"model": "a", "prompt": "x", "suffix": 5}), "completions", "suffix", "invalid_request"),
    ],
)
def test_invalid_bodies(raw: bytes, kind: str, param: str | None, code: str | None) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_body(raw, kind)  # type: ignore[arg-type]
    err = caught.value
    assert err.status_code == 400
    assert err.param == param
    if code:
        assert err.code == code
    body = err.to_openai()["error"]
    assert set(body) == {"message", "type", "param", "code"}


def test_unknown_model_names_available() -> None:
    parsed = parse_body(_raw({"model": "zzz", "messages": [{"role": "user"}]}), "chat")
    with pytest.raises(ModelNotFound) as caught:
        resolve_model(parsed, MODELS)
    assert caught.value.status_code == 404
    assert "available models: a, b" in caught.value.message


def test_unknown_window_defers_to_engine() -> None:
    parsed = parse_body(_raw({"model": "b", "messages": [{"role": "user"}], "max_tokens": 10**6}), "chat")
    assert resolve_model(parsed, MODELS).alias == "b"
