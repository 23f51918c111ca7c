"""Deterministic chat replies of the cloud simulator, in the OpenAI wire shapes.

A reply depends only on the request: the text is `[cloud-sim:<model>]` followed by the
words of the last user message (at most `MAX_ECHO_WORDS`), cut at `max_tokens`. A token is
a whitespace-separated word, so `usage` counts words. With `tools` and a `tool_choice` of
"required" or a named function the reply is one tool call whose arguments satisfy the
tool's parameter schema; with `response_format` json_object / json_schema the content is a
small JSON object (tool calls and JSON content are never cut at `max_tokens`).

`completion_body` renders the non-streamed body; `stream_events` the SSE events, whose
content deltas concatenate to exactly the non-streamed content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any, TypedDict

MAX_ECHO_WORDS = 32
_PIECE = re.compile(r"\s*\S+")


class BadChatRequest(Exception):
    def __init__(self, message: str, *, param: str | None = None, status: int = 400, code: str = "invalid_request"):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    name: str
    arguments: str
    wrong_arguments: str = "{}"  # what the tool_args_invalid fault sends instead (see `wrong_value`)


@dataclass(frozen=True)
class ReplyPlan:
    model: str
    content: str | None
    tool_call: ToolCall | None
    finish_reason: str
    prompt_tokens: int
    pieces: tuple[str, ...]
    include_usage: bool

    @property
    def completion_tokens(self) -> int:
        return len(self.pieces)

    def usage(self) -> dict[str, int]:
        total = self.prompt_tokens + self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "total_tokens": total}


class _PlanCommon(TypedDict):
    """The `ReplyPlan` fields every kind of reply shares (passed as `**common`)."""

    model: str
    prompt_tokens: int
    include_usage: bool


def request_model(body: Any) -> str | None:
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


def served_model(body: Any, models: tuple[str, ...]) -> str:
    """The body's model, when the body is an object naming one the simulator serves; raises `BadChatRequest`."""
    if not isinstance(body, dict):
        raise BadChatRequest("request body must be a JSON object")
    model = request_model(body)
    if model is None:
        raise BadChatRequest("'model' is required and must be a string", param="model")
    if model not in models:
        message = f"The model `{model}` does not exist or you do not have access to it."
        raise BadChatRequest(message, param="model", status=404, code="model_not_found")
    return model


def plan_reply(body: Any, models: tuple[str, ...], call_id: str) -> ReplyPlan:
    """Validate a chat body and decide the reply; raises `BadChatRequest`."""
    model = served_model(body, models)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise BadChatRequest("'messages' must be a non-empty array of message objects", param="messages")
    limit = _max_tokens(body)
    stream_options = body.get("stream_options")
    include_usage = isinstance(stream_options, dict) and stream_options.get("include_usage") is True
    words = _last_user_text(messages).split()[:MAX_ECHO_WORDS] or ["ok"]
    prompt_tokens = max(1, sum(len(_text(m.get("content")).split()) for m in messages))
    common: _PlanCommon = {"model": model, "prompt_tokens": prompt_tokens, "include_usage": include_usage}

    tool = _chosen_tool(body)
    if tool is not None:
        name, schema = tool
        arguments = json.dumps(example_value(schema, words, schema))
        pieces = tuple(_PIECE.findall(arguments))
        wrong = json.dumps(wrong_value(schema))
        call = ToolCall(call_id=call_id, name=name, arguments=arguments, wrong_arguments=wrong)
        return ReplyPlan(content=None, tool_call=call, finish_reason="tool_calls", pieces=pieces, **common)
    json_schema = _json_schema(body.get("response_format"))
    if json_schema is not None:
        content = json.dumps(example_value(json_schema, words, json_schema))
        return ReplyPlan(content=content, tool_call=None, finish_reason="stop", pieces=_pieces(content), **common)
    tokens = [f"[cloud-sim:{model}]", *words]
    finish = "length" if limit is not None and limit < len(tokens) else "stop"
    content = " ".join(tokens[:limit])
    return ReplyPlan(content=content, tool_call=None, finish_reason=finish, pieces=_pieces(content), **common)


def completion_body(plan: ReplyPlan, *, completion_id: str, created: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": plan.content}
    if plan.tool_call is not None:
        message["tool_calls"] = [_tool_call_json(plan.tool_call, plan.tool_call.arguments)]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": plan.model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": plan.finish_reason}],
        "usage": plan.usage(),
    }


def with_wrong_tool_arguments(plan: ReplyPlan) -> ReplyPlan:
    """The plan with its tool call's arguments replaced by `wrong_arguments` (no tool call: as is)."""
    if plan.tool_call is None:
        return plan
    call = replace(plan.tool_call, arguments=plan.tool_call.wrong_arguments)
    return replace(plan, tool_call=call, pieces=tuple(_PIECE.findall(call.arguments)))


def stream_events(plan: ReplyPlan, *, completion_id: str, created: int) -> list[str]:
    """Every SSE event: the role chunk, one chunk per piece, the finish chunk, the usage
    chunk when asked for, and `[DONE]`. Events 1..len(plan.pieces) carry the tokens."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": plan.model,
            "choices": [choice],
        }

    chunks = [chunk({"role": "assistant", "content": "" if plan.tool_call is None else None})]
    for i, piece in enumerate(plan.pieces):
        if plan.tool_call is None:
            chunks.append(chunk({"content": piece}))
        elif i == 0:
            chunks.append(chunk({"tool_calls": [{"index": 0, **_tool_call_json(plan.tool_call, piece)}]}))
        else:
            chunks.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
    chunks.append(chunk({}, plan.finish_reason))
    if plan.include_usage:
        last = chunk({})
        last["choices"] = []
        last["usage"] = plan.usage()
        chunks.append(last)
    return [sse_event(c) for c in chunks] + ["data: [DONE]\n\n"]


def sse_event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


def example_value(schema: Any, words: list[str], root: Any, depth: int = 0) -> Any:
    """A small value that satisfies common JSON-schema shapes (local `$ref`s resolved)."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    if isinstance(schema.get("$ref"), str):
        return example_value(_resolve(schema["$ref"], root), words, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return example_value(options[0], words, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties")
        if not isinstance(props, dict):
            props = {}
        return {name: example_value(sub, words, root, depth + 1) for name, sub in props.items()}
    if kind == "array":
        count = schema.get("minItems", 1) if isinstance(schema.get("minItems", 1), int) else 1
        return [example_value(schema.get("items", {"type": "string"}), words, root, depth + 1)] * count
    if kind == "string":
        return " ".join(words[:3])
    if kind in ("integer", "number"):
        minimum = schema.get("minimum")
        return minimum if isinstance(minimum, int | float) else 1
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return " ".join(words[:3])


_WRONG = {"string": 0, "integer": "not a number", "number": "not a number", "boolean": "not a boolean"}


def wrong_value(schema: Any) -> dict[str, Any]:
    """Arguments that break a tool's `parameters`: each declared property with a value of the wrong
    type, plus an undeclared `cloud_sim` key (invalid under `additionalProperties: false`)."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    wrong: dict[str, Any] = {}
    for name, sub in (props if isinstance(props, dict) else {}).items():
        kind = sub.get("type") if isinstance(sub, dict) else None
        wrong[name] = _WRONG.get(kind, 0) if isinstance(kind, str) else 0
        if kind in ("array", "object"):
            wrong[name] = f"not an {kind}"
    wrong["cloud_sim"] = "these arguments ignore the tool's parameters"
    return wrong


def _resolve(ref: str, root: Any) -> Any:
    node = root
    if not ref.startswith("#/"):
        return {}
    for part in ref[2:].split("/"):
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _tool_call_json(call: ToolCall, arguments: str) -> dict[str, Any]:
    return {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def _pieces(content: str) -> tuple[str, ...]:
    return tuple(_PIECE.findall(content))


def _max_tokens(body: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadChatRequest(f"'{name}' must be an integer >= 1", param=name)
        return value
    return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return _text(message.get("content"))
    return ""


def _chosen_tool(body: dict[str, Any]) -> tuple[str, Any] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list) or not tools:
        raise BadChatRequest("'tools' must be a non-empty array", param="tools")
    functions: dict[str, Any] = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadChatRequest("every tool needs a function with a name", param="tools")
        functions[function["name"]] = function.get("parameters") or {"type": "object", "properties": {}}
    choice = body.get("tool_choice")
    if choice == "required":
        name = next(iter(functions))
    elif isinstance(choice, dict):
        function = choice.get("function")
        chosen = function.get("name") if isinstance(function, dict) else None
        if chosen not in functions or not isinstance(chosen, str):  # a key of `functions` is a str
            raise BadChatRequest(f"tool_choice names an unknown function {chosen!r}", param="tool_choice")
        name = chosen
    else:
        return None
    return name, functions[name]


def _json_schema(response_format: Any) -> Any:
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object", "properties": {"answer": {"type": "string"}}}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise BadChatRequest("response_format.json_schema.schema must be an object", param="response_format")
        return schema
    raise BadChatRequest("response_format.type must be text, json_object or json_schema", param="response_format")


CONTENT_FILTERED = (
    "The response was filtered due to the prompt triggering the content management policy (simulated). "
    "Please modify your prompt and retry."
)


def content_filter(pattern: str | None, body: dict[str, Any]) -> None:
    """Raise the 400 a provider's content policy answers when a message's text matches `pattern`."""
    if pattern is None:
        return
    texts: list[str] = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [str(part.get("text", "")) for part in content if isinstance(part, dict)]
    if re.search(pattern, "\n".join(texts), re.IGNORECASE):
        raise BadChatRequest(CONTENT_FILTERED, param="prompt", code="content_filter")
