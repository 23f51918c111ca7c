"""Parse and check an OpenAI-style request body before it goes anywhere.

Pure functions: bytes in, a `ParsedRequest` or an `InvalidRequest`/`ModelNotFound`/
`ContextLengthExceeded` out. The checks here are the ones the gateway can make without
a tokenizer; the engine still checks the prompt length exactly and its answer is
translated into the same error classes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from router.errors import InvalidRequest, ModelNotFound

Kind = Literal["chat", "completions"]


@dataclass(frozen=True)
class ModelLimits:
    """What the gateway knows about a served model without asking it."""

    alias: str
    max_model_len: int | None


@dataclass(frozen=True)
class ParsedRequest:
    kind: Kind
    model: str
    body: dict[str, Any]
    stream: bool
    max_tokens: int | None


def parse_body(raw: bytes, kind: Kind) -> ParsedRequest:
    """Decode JSON and check the fields every request of `kind` must have."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object", code="invalid_json")

    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("`model` is required and must be a non-empty string", param="model")

    if kind == "chat":
        _check_messages(body.get("messages"))
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, (str, list)) or not prompt:
            raise InvalidRequest("`prompt` is required: a string or a list of strings/token ids", param="prompt")

    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("`stream` must be true or false", param="stream")

    max_tokens = max_tokens_of(body)
    return ParsedRequest(kind=kind, model=model, body=body, stream=stream, max_tokens=max_tokens)


def _check_messages(messages: Any) -> None:
    if messages is None:
        raise InvalidRequest("`messages` is required for chat completions", param="messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("`messages` must be a non-empty array", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest(f"`messages[{i}]` must be an object with a string `role`", param=f"messages[{i}]")


def max_tokens_of(body: Mapping[str, Any]) -> int | None:
    """`max_completion_tokens`, else `max_tokens`, else None; 400 when not a positive integer."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequest(f"`{key}` must be a positive integer", param=key)
        return value
    return None


def resolve_model(parsed: ParsedRequest, models: dict[str, ModelLimits]) -> ModelLimits:
    """The configured model the request names, or 404 naming the ones that exist. Whether the
    request fits the model's context is the contract pipeline's call (router/filters.py): a
    larger-context cloud target may serve it."""
    limits = models.get(parsed.model)
    if limits is None:
        known = ", ".join(sorted(models)) or "(none)"
        raise ModelNotFound(f"model {parsed.model!r} is not served here; available models: {known}", param="model")
    return limits
