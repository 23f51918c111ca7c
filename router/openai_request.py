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

from router.errors import ContextLengthExceeded, InvalidRequest, ModelNotFound

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

    max_tokens = _max_tokens(body)
    return ParsedRequest(kind=kind, model=model, body=body, stream=stream, max_tokens=max_tokens)


def _check_messages(messages: Any) -> None:
    if messages is None:
        raise InvalidRequest("`messages` is required for chat completions", param="messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("`messages` must be a non-empty array", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest(f"`messages[{i}]` must be an object with a string `role`", param=f"messages[{i}]")


def _max_tokens(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequest(f"`{key}` must be a positive integer", param=key)
        return value
    return None


def resolve_model(parsed: ParsedRequest, models: dict[str, ModelLimits]) -> ModelLimits:
    """The configured model the request names, or 404 naming the ones that exist."""
    limits = models.get(parsed.model)
    if limits is None:
        known = ", ".join(sorted(models)) or "(none)"
        raise ModelNotFound(f"model {parsed.model!r} is not served here; available models: {known}", param="model")
    if limits.max_model_len is not None and parsed.max_tokens is not None and parsed.max_tokens >= limits.max_model_len:
        raise ContextLengthExceeded(
            f"max_tokens={parsed.max_tokens} leaves no room for the prompt: model {limits.alias!r} has a context "
            f"window of {limits.max_model_len} tokens (prompt + max_tokens must fit in it)",
            param="max_tokens",
        )
    return limits


RESIDENCY_HEADER = "x-spillover-residency"
DEADLINE_HEADER = "x-spillover-deadline-ms"
RESIDENCY_VALUES = ("any", "local_only")


@dataclass(frozen=True)
class RoutingHints:
    """What the client's `x-spillover-*` headers ask of routing."""

    local_only: bool
    deadline_s: float


def parse_routing_headers(headers: Mapping[str, str], default_deadline_s: float) -> RoutingHints:
    residency = headers.get(RESIDENCY_HEADER, "any").strip().lower() or "any"
    if residency not in RESIDENCY_VALUES:
        raise InvalidRequest(
            f"header {RESIDENCY_HEADER} must be one of {', '.join(RESIDENCY_VALUES)}, not {residency!r}",
            param=RESIDENCY_HEADER,
        )
    deadline_s = default_deadline_s
    raw = headers.get(DEADLINE_HEADER)
    if raw is not None:
        try:
            deadline_ms = int(raw.strip())
        except ValueError:
            deadline_ms = 0
        if deadline_ms < 1:
            raise InvalidRequest(
                f"header {DEADLINE_HEADER} must be a positive integer (milliseconds)", param=DEADLINE_HEADER
            )
        deadline_s = deadline_ms / 1000
    return RoutingHints(local_only=residency == "local_only", deadline_s=deadline_s)
