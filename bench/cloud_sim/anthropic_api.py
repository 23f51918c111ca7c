"""The cloud simulator's Anthropic Messages API shapes (`spillover cloud-sim --api anthropic`).

It checks a `POST /v1/messages` body the way the Messages API documents it — `model`,
`max_tokens` (required, >= 1), `messages` of `user` / `assistant` turns whose content is a string
or typed blocks, a top-level `system` (no `system` role), `temperature` within 0..1, tools with an
`input_schema` object, `tool_choice` of auto / any / tool / none, and every `tool_result` answering
a `tool_use` id of the assistant turn just before it — and answers 400 `invalid_request_error`
otherwise. The reply is decided by the same deterministic plan as the OpenAI-protocol simulator
(`replies.plan_reply`, so both protocols answer the same request with the same words) and rendered
as a Messages reply (`message_body`) or its SSE events (`message_events`: message_start,
content_block_start, ping, one delta per token, content_block_stop, message_delta with the stop
reason and usage, message_stop). Errors have the Messages API shape
`{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import json
from typing import Any

from bench.cloud_sim.replies import BadChatRequest, ReplyPlan, plan_reply

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
FIRST_TOKEN_EVENT = 3  # message_start, content_block_start, ping, then the token deltas


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def plan_messages(body: Any, models: tuple[str, ...], call_id: str) -> ReplyPlan:
    """Check a Messages body and decide the reply; raises `BadChatRequest`."""
    if not isinstance(body, dict):
        raise BadChatRequest("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise BadChatRequest("model: Field required")
    if model not in models:
        raise BadChatRequest(f"model: {model}", status=404, code="not_found_error")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadChatRequest("max_tokens: Field required (an integer >= 1)")
    temperature = body.get("temperature")
    if temperature is not None and (not isinstance(temperature, int | float) or not 0 <= temperature <= 1):
        raise BadChatRequest("temperature: Input should be less than or equal to 1")
    chat = [{"role": "system", "content": _system(body.get("system"))}] if body.get("system") is not None else []
    chat += _turns(body.get("messages"))
    openai_body: dict[str, Any] = {"model": model, "messages": chat, "max_tokens": max_tokens}
    tools = body.get("tools")
    if tools is not None:
        openai_body["tools"] = [_tool(t, i) for i, t in enumerate(tools if isinstance(tools, list) else [None])]
        openai_body["tool_choice"] = _tool_choice(body.get("tool_choice"))
    return plan_reply(openai_body, models, call_id)


def _system(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in system):
        return " ".join(str(b.get("text", "")) for b in system)
    raise BadChatRequest("system: Input should be a string or a list of text blocks")


def _turns(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise BadChatRequest("messages: at least one message is required")
    out: list[dict[str, Any]] = []
    previous_tool_ids: set[str] = set()
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise BadChatRequest(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        content = message["content"] if "content" in message else None
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not blocks:
            raise BadChatRequest(f"messages.{i}.content: Input should be a string or a non-empty list of blocks")
        texts, tool_ids = [], set()
        for j, block in enumerate(blocks):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "tool_use" and role == "assistant" and isinstance(block.get("input"), dict):
                tool_ids.add(str(block.get("id")))
            elif kind == "tool_result" and role == "user":
                if block.get("tool_use_id") not in previous_tool_ids:
                    raise BadChatRequest(
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        "each tool_result must answer a tool_use of the previous assistant turn"
                    )
                texts.append(str(block.get("content", "")))
            elif kind == "image" and role == "user" and isinstance(block.get("source"), dict):
                continue
            else:
                raise BadChatRequest(f"messages.{i}.content.{j}: a {kind!r} block is not valid in a {role} turn")
        previous_tool_ids = tool_ids
        out.append({"role": role, "content": " ".join(texts)})
    return out


def _tool(tool: Any, i: int) -> dict[str, Any]:
    schema = tool.get("input_schema") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not isinstance(schema, dict):
        raise BadChatRequest(f"tools.{i}: a tool needs a name and an input_schema object")
    if schema.get("type") != "object":
        raise BadChatRequest(f"tools.{i}.input_schema.type: Input should be 'object'")
    return {"type": "function", "function": {"name": tool["name"], "parameters": schema}}


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if choice is None or kind in ("auto", "none"):
        return None
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadChatRequest("tool_choice: Input should be auto, any, tool or none")


def _content(plan: ReplyPlan) -> list[dict[str, Any]]:
    if plan.tool_call is not None:
        call = plan.tool_call
        return [{"type": "tool_use", "id": call.call_id, "name": call.name, "input": json.loads(call.arguments)}]
    return [{"type": "text", "text": plan.content or ""}]


def message_body(plan: ReplyPlan, *, message_id: str) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": plan.model,
        "content": _content(plan),
        "stop_reason": STOP_REASONS[plan.finish_reason],
        "stop_sequence": None,
        "usage": {"input_tokens": plan.prompt_tokens, "output_tokens": plan.completion_tokens},
    }


def sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def message_events(plan: ReplyPlan, *, message_id: str) -> list[str]:
    """Every SSE event; events FIRST_TOKEN_EVENT .. FIRST_TOKEN_EVENT + len(pieces) - 1 carry the tokens."""
    start = message_body(plan, message_id=message_id)
    start.update(content=[], stop_reason=None, usage={"input_tokens": plan.prompt_tokens, "output_tokens": 1})
    if plan.tool_call is not None:
        block: dict[str, Any] = {**_content(plan)[0], "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in plan.pieces]
    else:
        block = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": piece} for piece in plan.pieces]
    events = [
        sse("message_start", {"type": "message_start", "message": start}),
        sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
        sse("ping", {"type": "ping"}),
    ]
    events += [sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d}) for d in deltas]
    events.append(sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
    stop = {"stop_reason": STOP_REASONS[plan.finish_reason], "stop_sequence": None}
    usage = {"output_tokens": plan.completion_tokens}
    events.append(sse("message_delta", {"type": "message_delta", "delta": stop, "usage": usage}))
    events.append(sse("message_stop", {"type": "message_stop"}))
    return events


def models_body(models: tuple[str, ...]) -> dict[str, Any]:
    cards = [{"type": "model", "id": m, "display_name": m, "created_at": "2026-01-01T00:00:00Z"} for m in models]
    return {"data": cards, "has_more": False, "first_id": models[0], "last_id": models[-1]}
