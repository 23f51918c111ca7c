"""The legacy completions API of the cloud simulator (`POST /v1/completions`, api openai): the same deterministic
reply as a chat's, in the `text_completion` shapes.

The text is `[cloud-sim:<model>]` followed by the prompt's words (at most `MAX_ECHO_WORDS`), cut at `max_tokens`;
a token is a word, as for chat. A prompt is a string or a list of one string; token-id prompts, several prompts
(one choice each), `echo`, `logprobs`, `suffix` and `best_of` are refused with a 400 naming the field — the
simulator is a provider that serves the API without those, so a gateway must not send them here (its config
says `echo: false`, `logprobs: false`).
"""

from __future__ import annotations

from typing import Any

from bench.cloud_sim.replies import MAX_ECHO_WORDS, BadChatRequest, ReplyPlan, served_model, sse_event
from bench.cloud_sim.wire import OpenAIWire

UNSUPPORTED = ("echo", "logprobs", "suffix", "best_of")


def plan_completion(body: Any, models: tuple[str, ...]) -> ReplyPlan:
    """Validate a completions body and decide the reply; raises `BadChatRequest`."""
    model = served_model(body, models)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadChatRequest("'prompt' must be a string (cloud-sim takes one text prompt)", param="prompt")
    for name in UNSUPPORTED:
        if body.get(name) not in (None, False):
            raise BadChatRequest(f"'{name}' is not supported by this model", param=name)
    limit = body.get("max_tokens", 16)  # the legacy API's default
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise BadChatRequest("'max_tokens' must be an integer >= 1", param="max_tokens")
    stream_options = body.get("stream_options")
    words = prompt.split()
    tokens = [f"[cloud-sim:{model}]", *(words[:MAX_ECHO_WORDS] or ["ok"])]
    content = " ".join(tokens[:limit])
    pieces = tuple(f" {t}" if i else t for i, t in enumerate(tokens[:limit]))
    return ReplyPlan(
        model=model,
        content=content,
        tool_call=None,
        finish_reason="length" if limit < len(tokens) else "stop",
        prompt_tokens=max(1, len(words)),
        pieces=pieces,
        include_usage=isinstance(stream_options, dict) and stream_options.get("include_usage") is True,
    )


def completion_body(plan: ReplyPlan, *, completion_id: str, created: int) -> dict[str, Any]:
    choice = {"index": 0, "text": plan.content or "", "logprobs": None, "finish_reason": plan.finish_reason}
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": plan.model,
        "choices": [choice],
        "usage": plan.usage(),
    }


def completion_events(plan: ReplyPlan, *, completion_id: str, created: int) -> list[str]:
    """One chunk per piece, the finish chunk, the usage chunk when asked for, and `[DONE]`."""

    def chunk(text: str, finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {"id": completion_id, "object": "text_completion", "created": created, "model": plan.model,
                "choices": [choice]}  # fmt: skip

    chunks = [chunk(piece) for piece in plan.pieces] + [chunk("", plan.finish_reason)]
    if plan.include_usage:
        last = chunk("")
        last["choices"] = []
        last["usage"] = plan.usage()
        chunks.append(last)
    return [sse_event(c) for c in chunks] + ["data: [DONE]\n\n"]


class CompletionsWire(OpenAIWire):
    """`POST /v1/completions` beside the chat API of an OpenAI-compatible simulator (same key, errors, faults)."""

    path = "/v1/completions"
    id_prefix = "cmpl-"
    first_token_event = 1  # no role chunk: the first event already carries a token (paced as chat's first token)

    def plan(self, body: Any, models: tuple[str, ...], call_id: str) -> ReplyPlan:
        return plan_completion(body, models)

    def body(self, plan: ReplyPlan, reply_id: str, created: int) -> dict[str, Any]:
        return completion_body(plan, completion_id=reply_id, created=created)

    def events(self, plan: ReplyPlan, reply_id: str, created: int) -> list[str]:
        return completion_events(plan, completion_id=reply_id, created=created)

    def malformed_event(self, reply_id: str) -> str:
        return 'data: {"id":"' + reply_id + '","choices":[{"text"\n\n'
