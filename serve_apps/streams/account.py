"""A stream counted as it passes: its tokens, how it ended, and its answer for the output contract.

A non-streamed answer carries `usage`; a stream reports it only in a last chunk (`choices: []`,
`usage: {...}`) and only when the request says `stream_options: {"include_usage": true}`. So every
streamed request is sent upstream with that option on (`asking_usage`) — vLLM's OpenAI server, OpenAI
and OpenAI-compatible providers send the chunk; the Anthropic adapter builds it from the
`message_start` / `message_delta` usage — and the usage chunk is dropped on the way back when the
client did not ask for it (`wants_usage`), so a client sees exactly the chunks it asked for.

`Tally.feed(text)` reads the SSE events one backend yielded (one or several `data:` events), keeps
the reported usage, counts the content-bearing deltas (one per token on vLLM and the cloud
simulator; an estimate elsewhere), assembles choice 0's answer (router/output/tool_calls.py) and returns
the text to pass on without the usage chunk when it is to be dropped and without `[DONE]`.

`accounted(...)` wraps the stream the client reads. When it ends it calls `finish(StreamEnd)` once,
with the outcome and the tokens:

    ok                  `[DONE]` arrived (and the output contract, if any, let the answer pass)
    cut                 the backend failed after the first byte (an error raised or an error event
                        sent), or the stream ended without `[DONE]`
    cancelled           the client went away (the stream was closed before its end)
    contract_violation  an L1 answer's tool calls broke their schemas after bytes were sent: the
                        stream ends with the error event (serve_apps/http/surface.py) instead of `[DONE]`

and the tokens: the reported usage when the chunk arrived ("reported"), else the gateway's prompt
estimate and the counted deltas ("counted": what a cut or cancelled attempt consumed, as far as it is
known). `finish` runs synchronously in the generator's `finally` (no await: a cancelled task must
still book its attempt) and must not raise.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from router.error_codes import ErrorCode
from router.errors import RequestError, UpstreamError
from router.output.tool_calls import StreamedMessage

log = logging.getLogger("spillover.streams")

DONE = "data: [DONE]\n\n"


def wants_usage(body: Mapping[str, Any]) -> bool:
    """Whether the client asked for the usage chunk of its stream."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def asking_usage(body: dict[str, Any]) -> dict[str, Any]:
    """The body to send upstream: a stream asks for its usage chunk (other bodies as they are)."""
    if body.get("stream") is not True or wants_usage(body):
        return body
    options = body.get("stream_options")
    return {**body, "stream_options": {**(options if isinstance(options, dict) else {}), "include_usage": True}}


@dataclass(frozen=True)
class StreamEnd:
    outcome: str  # ok | cut | cancelled | contract_violation
    prompt_tokens: int
    completion_tokens: int
    usage: str  # "reported" (the backend's usage chunk) | "counted" (prompt estimate + deltas)
    error: RequestError | None = None
    contract: str | None = None  # summary of a violation let through (L2)
    contract_errors: tuple[str, ...] = ()
    # the assembled answer (content of choice 0) and its finish reason, for the loop check at its end
    text: str = field(default="", compare=False)
    finish_reason: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class StreamVerdict:
    """What the output contract says about a complete streamed answer (serve_apps/streams/contract.py)."""

    flagged: str | None = None  # L2: the violation's summary, the answer passed
    errors: tuple[str, ...] = ()
    violation: RequestError | None = None  # L1: end the stream with this error


StreamCheck = Callable[[StreamedMessage], Awaitable[StreamVerdict]]


class Tally:
    """What one stream's events say: reported usage, counted deltas, `[DONE]`, error events."""

    def __init__(self, *, drop_usage: bool = False) -> None:
        self.drop_usage = drop_usage
        self.reported: tuple[int, int] | None = None
        self.counted = 0
        self.done = False
        self.error_event: str | None = None  # the code of an error event the backend sent
        self.message = StreamedMessage()

    def tokens(self, est_prompt_tokens: int) -> tuple[int, int, str]:
        """(prompt, completion, where they come from)."""
        if self.reported is not None:
            return (*self.reported, "reported")
        return est_prompt_tokens, self.counted, "counted"

    def feed(self, text: str) -> str:
        """The text to pass on: `text` without `[DONE]` (and the usage chunk when dropped)."""
        if self.done:
            return ""
        kept: list[str] = []
        for event in text.split("\n\n"):
            if not event.strip():
                continue
            payload = "\n".join(line[5:].removeprefix(" ") for line in event.split("\n") if line.startswith("data:"))
            if payload == "[DONE]":
                self.done = True
                break
            if self._read(payload):
                kept.append(event + "\n\n")
        return "".join(kept)

    def _read(self, payload: str) -> bool:
        """Account one event's JSON; False when the event is to be dropped."""
        try:
            chunk = json.loads(payload) if payload else None
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            return True  # comments and what the backend's own reader let through pass as they are
        if "error" in chunk:
            error = chunk["error"]
            code = error.get("code") if isinstance(error, dict) else None
            self.error_event = str(code or ErrorCode.UPSTREAM_ERROR)[:80]
            return True
        choices = chunk.get("choices")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.reported = (_count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")))
            if self.drop_usage and not choices:
                return False
        if isinstance(choices, list):
            self.counted += sum(_carries_tokens(c) for c in choices)
            self.message.feed(chunk)
        return True


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _carries_tokens(choice: Any) -> bool:
    if not isinstance(choice, dict):
        return False
    if isinstance(choice.get("text"), str):  # completions
        return bool(choice["text"])
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return False
    return bool(delta.get("content")) or bool(delta.get("tool_calls")) or bool(delta.get("reasoning_content"))


async def accounted(
    chunks: AsyncIterator[str],
    tally: Tally,
    est_prompt_tokens: int,
    finish: Callable[[StreamEnd], object],
    check: StreamCheck | None = None,
) -> AsyncIterator[str]:
    """`chunks` as the client receives them, accounted in `tally`; `finish` once at the end."""
    outcome, verdict, exhausted = "cancelled", StreamVerdict(), False
    error: RequestError | None = None
    try:
        async for text in chunks:
            kept = tally.feed(text)
            if kept:
                yield kept
            if tally.done:
                break
        else:
            exhausted = True
        if not tally.done:  # ambiguous: the clean error event, and a continuation may finish it
            raise UpstreamError("the stream ended before [DONE]", code=ErrorCode.STREAM_CUT)
        if tally.error_event is None and check is not None:
            verdict = await check(tally.message)
            if verdict.violation is not None:
                outcome, error = "contract_violation", verdict.violation
                raise verdict.violation
        if tally.error_event is not None:
            outcome = "cut"
            error = UpstreamError.quoting("the stream failed after its first byte", tally.error_event)
        else:
            outcome = "ok"
        yield DONE
    except RequestError as exc:
        if outcome != "contract_violation":
            outcome, error, exhausted = "cut", exc, True
        raise
    except Exception as exc:
        outcome, exhausted = "cut", True
        error = UpstreamError(
            f"the stream failed after its first byte ({type(exc).__name__})", code=ErrorCode.STREAM_CUT
        )
        raise
    finally:
        prompt, completion, source = tally.tokens(est_prompt_tokens)
        message = tally.message
        end = StreamEnd(
            outcome, prompt, completion, source, error, verdict.flagged, verdict.errors, message.text,
            message.finish_reason,
        )  # fmt: skip
        try:
            finish(end)
        except Exception:  # bookkeeping never fails the stream
            log.exception("a stream's end could not be recorded")
        if not exhausted:
            await close_stream(chunks)


async def close_stream(chunks: AsyncIterator[str]) -> None:
    """Close a backend stream left before its end (a provider's HTTP response, a Ray stream)."""
    close = getattr(chunks, "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):  # best effort: what ended the stream is what propagates
            await close()
