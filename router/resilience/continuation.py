"""Continuing a broken stream: may it be continued, by whom, with what request.

Pure: no I/O, no clock. A text stream that breaks after its first byte (the client already has part
of the answer, so it can never be sent again) may be continued by the next candidate that accepts an
assistant prefill: that target gets the same request plus the text streamed so far as a trailing
assistant message, and its continuation is spliced into the same response
(serve_apps/streams/continuation.py carries it out).

    may_continue     the rule: the scenario continues streams (`Scenario.continues_streams`), the
                     answer is plain text (no tools, no response_format, no tool-call delta seen,
                     one choice) and some text was streamed
    can_continue     a target that may take the continuation: it accepts a prefill and streams
    prefill_body     the continuation request: the client's body, the streamed text as a trailing
                     assistant message, `continue_final_message: true` and
                     `add_generation_prompt: false` (vLLM's chat API; the Messages API adapter sends
                     the trailing assistant message as its prefill), usage asked for, and
                     `max_tokens` reduced by the tokens already streamed
    StreamSoFar      what the client has received: the text, the content chunks, the chunk id / model
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from router.request.contract import RequestContract
from router.routing.capabilities import Target

MAX_TOKEN_FIELDS = ("max_completion_tokens", "max_tokens")


@dataclass
class StreamSoFar:
    """What the client has received of one streamed answer (updated chunk by chunk)."""

    text: list[str] = field(default_factory=list)
    content_chunks: int = 0
    tool_calls: bool = False
    choices: int = 0  # the highest choice index seen, plus one
    finished: bool = False  # a finish_reason was seen
    first: dict[str, Any] | None = None  # id, created, model of the first chunk

    def see(self, text: str) -> None:
        """Note the SSE event(s) of one chunk the client received."""
        for chunk in parse_events(text):
            self._see(chunk)

    def _see(self, chunk: dict[str, Any]) -> None:
        if self.first is None:
            self.first = {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index")
            self.choices = max(self.choices, (index if isinstance(index, int) else 0) + 1)
            raw = choice.get("delta")
            delta: dict[str, Any] = raw if isinstance(raw, dict) else {}
            if delta.get("tool_calls"):
                self.tool_calls = True
            content = delta.get("content")
            if isinstance(content, str) and content:
                self.text.append(content)
                self.content_chunks += 1
            if choice.get("finish_reason"):
                self.finished = True

    @property
    def streamed(self) -> str:
        return "".join(self.text)


def parse_events(text: str) -> list[dict[str, Any]]:
    """The JSON objects of the `data: {...}` SSE events in `text` (one chunk may carry several);
    `[DONE]`, comments and anything that is not a JSON object are left out."""
    out = []
    for event in text.split("\n\n"):
        payload = "".join(line[5:].removeprefix(" ") for line in event.splitlines() if line.startswith("data:"))
        if not payload or payload == "[DONE]":
            continue
        try:
            chunk = json.loads(payload)
        except ValueError:
            continue
        if isinstance(chunk, dict):
            out.append(chunk)
    return out


def may_continue(contract: RequestContract, body: dict[str, Any], so_far: StreamSoFar, enabled: bool) -> str | None:
    """None when a broken stream may be continued; else why not (for the decision record)."""
    if not enabled:
        return f"scenario {contract.scenario} does not continue streams at level {contract.level}"
    if contract.checks_output or contract.needs_tools or body.get("tools") or body.get("response_format"):
        return "tool calls and JSON answers are never continued"
    if so_far.tool_calls:
        return "a tool call was streamed: never continued"
    if so_far.choices > 1 or (isinstance(body.get("n"), int) and body["n"] > 1):
        return "several choices are never continued"
    if so_far.finished:
        return "the stream broke after its finish_reason"
    if not so_far.streamed:
        return "no text was streamed yet"
    return None


def can_continue(target: Target) -> bool:
    """Whether `target` may take a continuation: it accepts a prefill and streams."""
    return target.known and target.caps.prefill and target.caps.streaming


def prefill_body(body: dict[str, Any], text: str, tokens_sent: int) -> dict[str, Any]:
    """The continuation request for `body` after `text` was streamed (`tokens_sent` content chunks).

    The prefill is `text` without trailing whitespace (the Messages API refuses an assistant prefill
    that ends in whitespace); `splice` drops the continuation's leading whitespace when the client's
    text already ended in it."""
    messages = [*body.get("messages", []), {"role": "assistant", "content": text.rstrip()}]
    out = {**body, "messages": messages, "stream": True, "continue_final_message": True}
    out["add_generation_prompt"] = False
    out["stream_options"] = {"include_usage": True}
    for name in MAX_TOKEN_FIELDS:
        limit = body.get(name)
        if isinstance(limit, int) and not isinstance(limit, bool):
            out[name] = max(1, limit - tokens_sent)
    return out


def splice(content: str, streamed: str, *, first: bool) -> str:
    """A continuation delta as the client receives it: its first text loses leading whitespace
    when the streamed text already ended in whitespace (the prefill was sent stripped)."""
    if first and streamed[-1:].isspace():
        return content.lstrip()
    return content
