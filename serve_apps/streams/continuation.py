"""A stream that breaks after its first byte, continued on the next target and spliced into the
same response (router/resilience/continuation.py decides whether and with what request).

`Splicer.stream(observed, job)` passes the first target's SSE events through, noting what the client
received. When that stream raises a `RequestError` (the connection dropped, the provider failed
mid-stream) and `may_continue` allows it, the remaining candidates that accept a prefill are tried in
order, each behind the resilience gate, the request's deadline and the gateway-wide retry budget:
the first that answers streams the rest of the answer, rewritten to the first stream's `id`,
`created` and `model` without its role chunk, and the client receives one answer. A continuation that
breaks in turn is continued by the next one from the text received so far. When nobody can continue,
the first error is raised and the gateway ends the stream with its clean error event, as before.

What the client sees of a continued answer: the text, then — before `data: [DONE]` — one chunk with
no choices and a `spillover` object, `{"continued": true, "from": <target>, "to": <target>,
"splice_after_chars": <n>, "splice_after_chunks": <n>}`. With `stream_options.include_usage` its
usage chunk counts both attempts: the broken one's prompt plus its streamed chunks as completion
tokens (an estimate: it never sent a usage), and the continuation's own usage (its prompt holds the
prefill).

The broken attempt is booked by the stream's own accounting when it breaks (serve_apps/streams/record.py:
outcome `cut` with the tokens it streamed, charged); when the whole stream ends, the request's decision
record is amended (`DecisionStore.amend`): each continuation attempt is appended (charged here), and
`events` holds the splice point (`continued`) or why there was none (`not_continued`)
and what the providers' streams needed tolerated (`stream_repaired`: skipped_events, done_missing).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from router.errors import RequestError, UpstreamError
from router.learning.decision import Attempt, DecisionRecord, DecisionStore
from router.request.contract import RequestContract
from router.resilience.continuation import StreamSoFar, can_continue, may_continue, parse_events, prefill_body, splice
from router.routing.capabilities import Target
from serve_apps.backend import BackendReply
from serve_apps.dispatch.interfaces import DispatchObserver
from serve_apps.resilience.state import Resilience

DONE = "data: [DONE]\n\n"
_FINISHED = "\x00finished"  # what `_one` yields after a continuation that finished (never sent)
REPAIR_KINDS = {"skipped_events": "skipped_event", "done_missing": "done_missing"}  # record key -> metric kind
Call = Callable[[Target, dict[str, Any], str], Awaitable[BackendReply]]  # target, body, request id


@dataclass(frozen=True)
class StreamJob:
    """One streamed answer and what its continuation may use."""

    request_id: str
    contract: RequestContract
    body: dict[str, Any]  # the client's body as sent to cloud targets
    local_body: dict[str, Any]  # as sent to local targets (salted)
    target: Target  # the target streaming now
    source: object  # its raw stream (a provider stream carries `tolerance`)
    rest: Sequence[Target]  # the candidates after it, in order
    deadline: float
    enabled: bool  # the scenario continues streams at this level
    attempts_made: int
    client_usage: bool | None = None  # the client asked for a usage chunk (None: read `body`)


@dataclass
class _Run:
    """What one spliced stream did, for the record."""

    so_far: StreamSoFar = field(default_factory=StreamSoFar)
    cut: Attempt | None = None  # the broken first attempt, as the record should show it
    attempts: list[Attempt] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    usage: tuple[int, int] = (0, 0)  # prompt, completion tokens of the broken part (estimated)


class Splicer:
    def __init__(
        self,
        *,
        call: Call,
        resilience: Resilience,
        decisions: DecisionStore,
        observer: DispatchObserver,
        clock: Callable[[], float],
        max_attempts: int,
    ) -> None:
        self._call = call
        self._res = resilience
        self._decisions = decisions
        self._observer = observer
        self._clock = clock
        self._max_attempts = max_attempts

    async def stream(self, observed: AsyncIterator[str], job: StreamJob) -> AsyncIterator[str]:
        run = _Run()
        try:
            try:
                async for chunk in observed:
                    if job.enabled:  # only a stream that may be continued needs reading
                        run.so_far.see(chunk)
                    yield chunk
            except RequestError as exc:
                why = may_continue(job.contract, job.body, run.so_far, job.enabled)
                if why is not None:
                    self._not_continued(run, job, exc, why)
                    raise
                run.cut = self._cut_attempt(job, run, exc)
                async for chunk in self._continue(job, run, exc):
                    yield chunk
        finally:
            await _close(observed)  # a client that left: the first stream's accounting books it cancelled first
            self._repairs(run, job.target, job.source)
            self._amend(job, run)

    async def _continue(self, job: StreamJob, run: _Run, first_error: RequestError) -> AsyncIterator[str]:
        tried: list[str] = []
        for target in job.rest:
            if not can_continue(target):
                tried.append(f"{target.id}: accepts no prefill")
                continue
            if job.attempts_made + len(run.attempts) + 1 > self._max_attempts or self._clock() >= job.deadline:
                tried.append("attempt budget spent (count or deadline)")
                break
            if not self._res.budget.try_withdraw():
                tried.append("gateway retry budget exhausted")
                break
            finished = False
            async for chunk in self._one(job, run, target, tried):
                if chunk == _FINISHED:
                    finished = True
                    break
                yield chunk
            if finished:
                yield self._marker(run)
                yield DONE
                return
        self._not_continued(run, job, first_error, "; ".join(tried) or "no candidate left")
        raise first_error

    async def _one(self, job: StreamJob, run: _Run, target: Target, tried: list[str]) -> AsyncIterator[str]:
        """One continuation attempt: its rewritten events, then `_FINISHED` when it finished; nothing
        more (the reason appended to `tried`) when it failed."""
        tokens = job.contract.est_prompt_tokens + job.contract.max_output_tokens
        gate = await self._res.gate(target, has_alternative=True, tokens=tokens)
        if gate.refused is not None:
            tried.append(f"{target.id}: {gate.refused}"[:200])
            return
        sent_before, chunks_before = run.so_far.streamed, run.so_far.content_chunks
        body = prefill_body(job.local_body if target.kind == "local" else job.body, sent_before, chunks_before)
        began, usage, outcome, error = self._clock(), (0, 0), "cancelled", None
        first_text = True
        reply: BackendReply | None = None
        try:
            reply = await self._call(target, body, job.request_id)
            if reply.chunks is None:
                raise UpstreamError(f"{target.id} answered a continuation without a stream")
            async for text in reply.chunks:
                for chunk in parse_events(text):
                    if isinstance(chunk.get("usage"), dict) and not chunk.get("choices"):
                        found = chunk["usage"]
                        usage = (int(found.get("prompt_tokens") or 0), int(found.get("completion_tokens") or 0))
                        if job.client_usage if job.client_usage is not None else _wants_usage(job.body):
                            yield _event(self._usage_chunk(run, usage))
                        continue
                    rewritten, first_text = _rewrite(chunk, run.so_far, sent_before, first_text)
                    if rewritten is not None:
                        run.so_far.see(_event(rewritten))
                        yield _event(rewritten)
        except RequestError as exc:
            self._res.failed(target, exc)
            outcome, error = "error", exc.code
            tried.append(f"{target.id}: {exc.code}")
        else:
            outcome = "ok"
            self._res.succeeded(target)
        finally:
            self._res.settle(gate.reservation, sum(usage) or tokens)
            if usage == (0, 0):  # no usage sent: the prompt estimate and the chunks streamed
                usage = (job.contract.est_prompt_tokens, run.so_far.content_chunks - chunks_before)
            attempt = Attempt.priced(target, outcome, self._clock() - began, *usage, error)
            run.attempts.append(attempt)
            self._res.charge(job.request_id, target, outcome, attempt.cost_usd, job.contract.tenant)
            if reply is not None and reply.chunks is not None:
                self._repairs(run, target, reply.chunks)
                await _close(reply.chunks)
        if outcome == "ok":
            splice_at = {"from": job.target.id, "to": target.id, "splice_after_chars": len(sent_before)}
            splice_at["splice_after_chunks"] = chunks_before
            run.events.append({"kind": "continued", **splice_at, "error": run.cut.error if run.cut else None})
            self._observer.stream_repaired(target.id, "continued")
            yield _FINISHED

    def _cut_attempt(self, job: StreamJob, run: _Run, exc: RequestError) -> Attempt:
        """The broken first attempt, for the splice's facts and the usage chunk; the stream's own
        accounting (serve_apps/streams/account.py) has already booked it as `cut`: charged, in the record."""
        run.usage = (job.contract.est_prompt_tokens, run.so_far.content_chunks)
        return Attempt.priced(job.target, "cut", 0.0, *run.usage, exc.code)

    def _usage_chunk(self, run: _Run, usage: tuple[int, int]) -> dict[str, Any]:
        prompt, completion = run.usage[0] + usage[0], run.usage[1] + usage[1]
        total = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        return {**_head(run.so_far), "object": "chat.completion.chunk", "choices": [], "usage": total}

    def _marker(self, run: _Run) -> str:
        splice_at = next(e for e in reversed(run.events) if e["kind"] == "continued")
        facts = {k: splice_at[k] for k in ("from", "to", "splice_after_chars", "splice_after_chunks")}
        marker = {**_head(run.so_far), "object": "chat.completion.chunk", "choices": []}
        return _event({**marker, "spillover": {"continued": True, **facts}})

    def _not_continued(self, run: _Run, job: StreamJob, exc: RequestError, why: str) -> None:
        run.events.append({"kind": "not_continued", "target": job.target.id, "error": exc.code, "why": why[:300]})
        self._observer.stream_repaired(job.target.id, "not_continued")

    def _repairs(self, run: _Run, target: Target, source: object) -> None:
        tolerance = getattr(source, "tolerance", None)
        repairs = getattr(tolerance, "repairs", None)
        if not isinstance(repairs, dict) or not repairs:
            return
        if any(e.get("kind") == "stream_repaired" and e.get("target") == target.id for e in run.events):
            return
        run.events.append({"kind": "stream_repaired", "target": target.id, **repairs})
        for kind in repairs:
            self._observer.stream_repaired(target.id, REPAIR_KINDS.get(str(kind), str(kind)))

    def _amend(self, job: StreamJob, run: _Run) -> None:
        if run.cut is None and not run.attempts and not run.events:
            return

        def change(record: DecisionRecord) -> DecisionRecord:
            reason = record.reason
            continued = [e for e in run.events if e["kind"] == "continued"]
            if continued:
                reason = f"{reason}; the stream broke and was continued on {continued[-1]['to']}"[:300]
            events = (*record.events, *run.events)
            return replace(record, attempts=(*record.attempts, *run.attempts), events=events, reason=reason)

        amended = self._decisions.amend(job.request_id, change)
        if amended is not None and run.attempts:  # metrics: the continuation's tokens and cost
            self._observer.recorded(replace(amended, attempts=tuple(run.attempts), session=None))


async def _close(chunks: AsyncIterator[str]) -> None:
    close = getattr(chunks, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:  # noqa: BLE001 - closing an abandoned stream must not fail the answer
            return


def _rewrite(
    chunk: dict[str, Any], so_far: StreamSoFar, sent_before: str, first_text: bool
) -> tuple[dict[str, Any] | None, bool]:
    """A continuation chunk as the client's stream goes on: the first stream's id, created and
    model, no role, the splice's whitespace fixed; None when nothing is left of it."""
    choices = []
    for choice in chunk.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = {k: v for k, v in (choice.get("delta") or {}).items() if k != "role"}
        content = delta.get("content")
        if isinstance(content, str) and content:
            delta["content"] = splice(content, sent_before, first=first_text)
            first_text = False
            if not delta["content"]:
                del delta["content"]
        elif "content" in delta:
            del delta["content"]
        if delta or choice.get("finish_reason"):
            choices.append({**choice, "delta": delta})
    if not choices:
        return None, first_text
    return {**chunk, **_head(so_far), "choices": choices}, first_text


def _head(so_far: StreamSoFar) -> dict[str, Any]:
    return dict(so_far.first or {})


def _wants_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _event(chunk: dict[str, Any]) -> str:
    return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"
