"""Parse and check an OpenAI-style request body before it goes anywhere.

Pure functions: bytes in, a `ParsedRequest` or an `InvalidRequest`/`ModelNotFound`/
`ContextLengthExceeded` out. The checks here are the ones the gateway can make without
a tokenizer; the engine still checks the prompt length exactly and its answer is
translated into the same error classes.

Hostile bodies are a 400, never a 500 further on: non-finite numbers (`NaN`, `Infinity`),
integers beyond Python's digit limit and nesting deeper than `MAX_DEPTH` are refused while
decoding, and the fields the gateway or a provider adapter reads must have their OpenAI types
(`messages[i].tool_calls` a list of objects, `temperature` a number, ...).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from router.error_codes import ErrorCode
from router.errors import InvalidRequest, ModelNotFound

Kind = Literal["chat", "completions"]

MAX_DEPTH = 64  # JSON nesting a request may have (a deep JSON Schema in response_format needs ~20)


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
    body = decode_json(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object", code=ErrorCode.INVALID_JSON)

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
    _check_types(body)
    return ParsedRequest(kind=kind, model=model, body=body, stream=stream, max_tokens=max_tokens)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def decode_json(raw: bytes) -> Any:
    """JSON with finite numbers only, nested at most `MAX_DEPTH` deep, and no lone UTF-16 surrogate
    (`"\\ud800"`: no UTF-8 text can carry it, so it could reach no engine, provider, log or hash);
    else 400 invalid_json."""
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:
        raise InvalidRequest(
            f"request body is nested deeper than {MAX_DEPTH} levels", code=ErrorCode.INVALID_JSON
        ) from None
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, NaN, an integer past the digit limit
        raise InvalidRequest(f"request body is not valid JSON: {str(exc)[:200]}", code=ErrorCode.INVALID_JSON) from None
    shape = shape_error(value, MAX_DEPTH)
    if shape == "depth":
        raise InvalidRequest(f"request body is nested deeper than {MAX_DEPTH} levels", code=ErrorCode.INVALID_JSON)
    if shape == "surrogate":
        where = _surrogate_path(value)[:200]
        raise InvalidRequest(
            f"request body holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape) at {where}: "
            "it is not text; send valid Unicode",
            param=where,
            code=ErrorCode.INVALID_JSON,
        )
    return value


def _unpaired(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def shape_error(value: Any, limit: int) -> Literal["depth", "surrogate"] | None:
    """One walk: nesting past `limit`, or a string (value or key) holding a lone surrogate."""
    if isinstance(value, str):
        return "surrogate" if _unpaired(value) else None
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if any(_unpaired(k) for k in item):
                return "surrogate"
            children: Any = item.values()
        else:
            children = item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > limit:
                    return "depth"
                stack.append((child, depth + 1))
            elif isinstance(child, str) and _unpaired(child):
                return "surrogate"
    return None


def _surrogate_path(value: Any, path: str = "") -> str:
    """Where the first lone surrogate is, e.g. `messages[0].content` (only on the error path)."""
    if isinstance(value, dict):
        for key, child in value.items():
            here = f"{path}.{key}" if path else key
            if _unpaired(key):
                return f"{path}.(a key)" if path else "(a key)"
            if shape_error(child, MAX_DEPTH) == "surrogate":
                return _surrogate_path(child, here)
    elif isinstance(value, list):
        for index, child in enumerate(value):
            if shape_error(child, MAX_DEPTH) == "surrogate":
                return _surrogate_path(child, f"{path}[{index}]")
    return path or "(body)"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_str_or_str_list(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))


# Optional top-level fields and the type each must have when present (OpenAI's API reference).
_FIELD_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "temperature": (_is_number, "a number"),
    "top_p": (_is_number, "a number"),
    "presence_penalty": (_is_number, "a number"),
    "frequency_penalty": (_is_number, "a number"),
    "n": (_is_int, "an integer"),
    "seed": (_is_int, "an integer"),
    "top_logprobs": (_is_int, "an integer"),
    "logprobs": (lambda v: isinstance(v, bool) or _is_int(v), "a boolean (an integer for completions)"),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "true or false"),
    "echo": (lambda v: isinstance(v, bool), "true or false"),  # completions: decides where it may burst
    "suffix": (lambda v: isinstance(v, str), "a string"),
    "stop": (_is_str_or_str_list, "a string or a list of strings"),
    "user": (lambda v: isinstance(v, str), "a string"),
    "tools": (lambda v: isinstance(v, list) and all(isinstance(t, dict) for t in v), "a list of objects"),
    "tool_choice": (lambda v: isinstance(v, str | dict), "a string or an object"),
    "response_format": (lambda v: isinstance(v, dict), "an object"),
    "stream_options": (
        lambda v: isinstance(v, dict) and isinstance(v.get("include_usage", False), bool | None),
        "an object (its include_usage true or false)",
    ),
    "logit_bias": (lambda v: isinstance(v, dict) and all(_is_number(b) for b in v.values()), "an object of numbers"),
}


def _check_types(body: Mapping[str, Any]) -> None:
    for key, (ok, what) in _FIELD_TYPES.items():
        value = body.get(key)
        if value is not None and not ok(value):
            raise InvalidRequest(f"`{key}` must be {what}", param=key)


def _check_messages(messages: Any) -> None:
    if messages is None:
        raise InvalidRequest("`messages` is required for chat completions", param="messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("`messages` must be a non-empty array", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest(f"`messages[{i}]` must be an object with a string `role`", param=f"messages[{i}]")
        _check_message(message, f"messages[{i}]")


def _check_message(message: Mapping[str, Any], where: str) -> None:
    content = message.get("content")
    if content is not None and not (
        isinstance(content, str) or (isinstance(content, list) and all(isinstance(p, dict) for p in content))
    ):
        raise InvalidRequest(f"`{where}.content` must be a string or a list of content parts", param=f"{where}.content")
    calls = message.get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
        raise InvalidRequest(f"`{where}.tool_calls` must be a list of objects", param=f"{where}.tool_calls")
    for key in ("name", "tool_call_id"):
        if message.get(key) is not None and not isinstance(message[key], str):
            raise InvalidRequest(f"`{where}.{key}` must be a string", param=f"{where}.{key}")


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
    request fits the model's context is the contract pipeline's call (router/routing/filters.py): a
    larger-context cloud target may serve it."""
    limits = models.get(parsed.model)
    if limits is None:
        known = ", ".join(sorted(models)) or "(none)"
        raise ModelNotFound(f"model {parsed.model!r} is not served here; available models: {known}", param="model")
    return limits
