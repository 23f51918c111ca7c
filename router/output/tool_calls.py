"""A streamed chat answer put back together from its chunks, to check it once it is complete.

A stream carries an answer as deltas: `content` in pieces, and tool calls keyed by their `index`,
the first delta of a call bringing its `id`, `type` and `function.name`, later ones pieces of
`function.arguments` (OpenAI and vLLM send them so; the Anthropic adapter translates its
`input_json_delta` events into the same shape). `StreamedMessage.feed(chunk)` takes one
`chat.completion.chunk` object; `message()` is choice 0's assistant message as a non-streamed
answer carries it, which `router.output.output_contract.check_output` checks like any other
(`check_streamed`).

Everything a provider sends is untrusted, so the assembly is bounded: at most `MAX_TOOL_CALLS`
calls and `MAX_CHARS` characters of content and arguments together. Past either bound the message
is `overflowed`, and the check reports that as a violation rather than validating a cut-off text.
Only choice 0 is assembled (the non-streamed check reads choice 0 too). Pure: no I/O, no clock
reads beyond the one `check_output` is given.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from router.output.output_contract import VALIDATION_TIMEOUT_S, OutputVerdict, check_output
from router.request.contract import RequestContract

MAX_TOOL_CALLS = 128
MAX_CHARS = 1_000_000  # content + tool-call arguments of one streamed answer


class StreamedMessage:
    def __init__(self, *, max_chars: int = MAX_CHARS, max_calls: int = MAX_TOOL_CALLS) -> None:
        self._max_chars = max_chars
        self._max_calls = max_calls
        self._content: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}  # index -> {"id", "name", "arguments": [pieces]}
        self._chars = 0
        self.overflowed = ""  # why the message stopped being assembled ("" while it is whole)
        self.finish_reason: str | None = None  # choice 0's, once a chunk carried it

    @property
    def has_content(self) -> bool:
        """Whether any non-empty content delta arrived (a text answer, not only tool calls)."""
        return bool(self._content)

    @property
    def text(self) -> str:
        """The content assembled so far (a text answer's whole text once the stream ended)."""
        return "".join(self._content)

    @property
    def has_tool_calls(self) -> bool:
        return bool(self._calls)

    def feed(self, chunk: Mapping[str, Any]) -> None:
        """One `chat.completion.chunk`; anything not in the documented shape is ignored."""
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._feed_delta(delta)

    def _feed_delta(self, delta: Mapping[str, Any]) -> None:
        content = delta.get("content")
        if isinstance(content, str) and content and self._take(len(content)):
            self._content.append(content)
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for position, call in enumerate(calls):
                if isinstance(call, dict):
                    self._feed_call(call, position)

    def _feed_call(self, call: Mapping[str, Any], position: int) -> None:
        index = call.get("index", position)
        if not isinstance(index, int) or isinstance(index, bool):
            return
        slot = self._calls.get(index)
        if slot is None:
            if len(self._calls) >= self._max_calls:
                self.overflowed = self.overflowed or f"more than {self._max_calls} tool calls"
                return
            slot = self._calls[index] = {"id": None, "name": "", "arguments": []}
        if isinstance(call.get("id"), str) and slot["id"] is None:
            slot["id"] = call["id"]
        function = call.get("function")
        if not isinstance(function, dict):
            return
        name = function.get("name")
        if isinstance(name, str) and name and self._take(len(name)):
            slot["name"] += name
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments and self._take(len(arguments)):
            slot["arguments"].append(arguments)

    def _take(self, chars: int) -> bool:
        if self.overflowed:
            return False
        self._chars += chars
        if self._chars > self._max_chars:
            self.overflowed = f"more than {self._max_chars} characters of content and tool arguments"
            return False
        return True

    def message(self) -> dict[str, Any]:
        """Choice 0's assistant message: `content` (None without any) and `tool_calls` (when any)."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._content) or None}
        if self._calls:
            message["tool_calls"] = [
                {
                    "id": slot["id"],
                    "type": "function",
                    "function": {"name": slot["name"], "arguments": "".join(slot["arguments"])},
                }
                for _, slot in sorted(self._calls.items())
            ]
        return message


def check_streamed(
    contract: RequestContract,
    message: StreamedMessage,
    *,
    timeout_s: float = VALIDATION_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
) -> OutputVerdict:
    """The output contract's verdict on a complete streamed answer. A repaired verdict cannot
    apply (the text was already sent): it is reported as a violation saying so."""
    if message.overflowed:
        error = f"the streamed answer was not checked: {message.overflowed}"
        return OutputVerdict("violated", (error,), error_count=1)
    verdict = check_output(contract, message.message(), timeout_s=timeout_s, clock=clock)
    if verdict.status == "repaired":
        error = "content: JSON surrounded by other text (a streamed answer cannot be repaired)"
        return OutputVerdict("violated", (error,), error_count=1)
    return verdict
