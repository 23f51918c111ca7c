"""Two request checks of the cloud simulator that real providers make: the context window and the
assistant prefill.

`context_window` (a setting; null: unlimited): a request whose prompt words plus `max_tokens` pass it is
answered 400 the way each API does — OpenAI-compatible `code: context_length_exceeded` ("This model's
maximum context length is ..."), the Messages API `invalid_request_error` "prompt is too long: N tokens >
M maximum".

A prefill is a trailing assistant message the model should continue: on the OpenAI-compatible wire
only with `continue_final_message: true` (vLLM's chat extension; without it a trailing assistant message
is history), on the Messages API always. With `accepts_prefill: true` (the default) the reply continues
the answer: the words of the plan after as many words as the prefill holds (the sim's answers are
deterministic, so a continuation from another simulator picks up where the broken one stopped). With
`accepts_prefill: false` it is refused with a 400, as by a provider or model without prefill (the
OpenAI API's "Unrecognized request argument supplied: continue_final_message", the Messages API's
"does not support assistant message prefill"). The Messages API also refuses a prefill that ends in
whitespace, as the real one does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bench.cloud_sim.replies import BadChatRequest, ReplyPlan
from bench.cloud_sim.settings import SimSettings


def checked_plan(plan: ReplyPlan, body: dict[str, Any], settings: SimSettings) -> ReplyPlan:
    """`plan` after the context window and prefill checks; raises `BadChatRequest` (400)."""
    _check_window(plan, body, settings)
    prefill = prefill_text(body, settings.api)
    if prefill is None:
        return plan
    if not settings.accepts_prefill:
        if settings.api == "anthropic":
            raise BadChatRequest(
                "This model does not support assistant message prefill. The conversation must end with a user message."
            )
        raise BadChatRequest("Unrecognized request argument supplied: continue_final_message", param="messages")
    if settings.api == "anthropic" and prefill != prefill.rstrip():
        raise BadChatRequest("messages: final assistant content cannot end with trailing whitespace")
    if plan.tool_call is not None:
        return plan
    rest = plan.pieces[len(prefill.split()) :]
    return replace(plan, content="".join(rest), pieces=rest, finish_reason=plan.finish_reason if rest else "stop")


def prefill_text(body: dict[str, Any], api: str) -> str | None:
    """The trailing assistant message's text when the request asks for it to be continued."""
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return None
    if api == "openai" and body.get("continue_final_message") is not True:
        return None
    content = last.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))
    return ""


def _check_window(plan: ReplyPlan, body: dict[str, Any], settings: SimSettings) -> None:
    window = settings.context_window
    if window is None:
        return
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    output = limit if isinstance(limit, int) and not isinstance(limit, bool) else 0
    needed = plan.prompt_tokens + output
    if needed <= window:
        return
    if settings.api == "anthropic":
        raise BadChatRequest(f"prompt is too long: {needed} tokens > {window} maximum")
    message = (
        f"This model's maximum context length is {window} tokens. However, you requested {needed} tokens "
        f"({plan.prompt_tokens} in the messages, {output} in the completion). Please reduce the length of the "
        "messages or completion."
    )
    raise BadChatRequest(message, param="messages", code="context_length_exceeded")
