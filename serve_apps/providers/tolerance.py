"""What a provider's stream may get wrong and still be a complete answer.

    one malformed event between valid ones   skipped and counted (`skipped`); a second one, one
                                             before any valid event, one right before the end or one
                                             in a stream of tool calls (a lost piece of a call's JSON
                                             cannot be told from none) still fails the stream
                                             (provider_malformed)
    no `[DONE]` (or message_stop) after a    finalised as complete (`done_missing`): every choice
    finish_reason                            ended, the usage chunk if any came before the end
    an end (or lost connection) before any   still fails the stream (provider_cut): the answer may
    finish_reason                            be incomplete

The stream adapters (`sse.ProviderEventStream`, the Anthropic stream) ask `StreamTolerance`; the
dispatcher reads `repairs` when the stream ends (decision record, metrics).
"""

from __future__ import annotations

from typing import Any

from router.errors import UpstreamError

MAX_SKIPPED_EVENTS = 1


class StreamTolerance:
    def __init__(self) -> None:
        self.skipped = 0
        self.done_missing = False
        self._valid_seen = False
        self._tool_calls = False
        self._finished = False
        self._pending: UpstreamError | None = None

    def malformed(self, error: UpstreamError) -> None:
        """A malformed event arrived: held (skipped once the next valid event comes) or raised."""
        if not self._valid_seen or self._tool_calls or self._pending is not None or self.skipped >= MAX_SKIPPED_EVENTS:
            raise self._pending or error
        self._pending = error

    def valid(self, chunk: dict[str, Any]) -> None:
        """A valid chunk arrived (after `malformed`, the held event is skipped for good, unless this
        chunk carries a tool call)."""
        choices = [c for c in chunk.get("choices") or [] if isinstance(c, dict)]
        if any(isinstance(c.get("delta"), dict) and c["delta"].get("tool_calls") for c in choices):
            self._tool_calls = True
        if self._pending is not None:
            if self._tool_calls:
                raise self._pending
            self._pending = None
            self.skipped += 1
        self._valid_seen = True
        if any(c.get("finish_reason") for c in choices):
            self._finished = True

    def ended(self, cut: UpstreamError) -> None:
        """The stream ended (or its connection failed) without its end marker: returns when it is
        complete all the same (`done_missing`), else raises what makes it ambiguous."""
        if self._pending is not None:
            raise self._pending
        if not self._finished:
            raise cut
        self.done_missing = True

    @property
    def repairs(self) -> dict[str, int]:
        """What was tolerated, for the record: skipped_events, done_missing (0/1)."""
        return {k: v for k, v in (("skipped_events", self.skipped), ("done_missing", int(self.done_missing))) if v}
