"""Booking a streamed attempt when its stream ends (serve_apps/streams/account.py says how it ended).

The dispatcher returns as soon as a stream's first byte is there, and stores the request's decision
record then, with the attempt marked `streaming` and kept out of the decision log
(`DecisionStore.put(final=False)`). When the stream ends, `book_stream_end` does what the dispatcher
does at once for a complete answer, with what the stream really consumed:

* breakers and health hear the outcome (`cut` and `contract_violation` as failures, `ok` as a
  success; a client that went away says nothing about the target);
* the attempt is priced from its tokens (reported, or counted) and written to the spend ledger
  with its outcome, the provider quota is settled with those tokens;
* the record gets the final attempt (outcome, latency to the end of the stream, tokens, cost, the
  output contract's flag) and its end time, replaces the stored one and goes to the decision log;
  the observer (`/metrics`) counts its attempts, tokens and cost then.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from router.error_codes import ErrorCode
from router.errors import UpstreamError
from router.learning.decision import Attempt, DecisionRecord, DecisionStore
from router.limits.quota import Reservation
from router.routing.capabilities import Target
from serve_apps.dispatch.interfaces import DispatchObserver
from serve_apps.resilience.state import Resilience
from serve_apps.streams.account import StreamEnd
from serve_apps.streams.output_loops import FLAG as LOOP_FLAG


@dataclass
class StreamedAttempt:
    """The attempt whose stream the client reads; `record` is set once the dispatcher stored it."""

    request_id: str
    tenant: str | None
    target: Target
    began: float
    reservation: Reservation | None
    est_tokens: int  # what the quota reserved, settled with when nothing was counted
    record: DecisionRecord | None = None
    loop: Callable[[str, str | None], str | None] | None = None  # a whole answer's greedy loop, if any


def book_stream_end(
    streamed: StreamedAttempt,
    end: StreamEnd,
    *,
    resilience: Resilience,
    decisions: DecisionStore,
    observer: DispatchObserver,
    clock: Callable[[], float],
    wall: Callable[[], float] | None = None,
) -> DecisionRecord | None:
    """Book how the stream ended; the final record (None when the record was never stored). Latency on
    `clock` (monotonic, like `streamed.began`), the record's `finished_at` on `wall` (default: `clock`)."""
    target = streamed.target
    loop = streamed.loop(end.text, end.finish_reason) if streamed.loop and end.outcome == "ok" else None
    if end.outcome in ("cut", "contract_violation"):
        resilience.failed(target, end.error or UpstreamError("the stream failed", code=ErrorCode.STREAM_CUT))
    elif loop is not None:  # a greedy loop (serve_apps/streams/output_loops.py): an output failure, flagged
        resilience.output_failed(target)
        end = replace(end, contract_errors=(*end.contract_errors, f"{LOOP_FLAG}: {loop}"))
    elif end.outcome == "ok":
        resilience.succeeded(target)
    code = (end.error.code if end.error is not None else None) or None
    attempt = Attempt.priced(
        target, end.outcome, clock() - streamed.began, end.prompt_tokens, end.completion_tokens, code
    )
    attempt = replace(attempt, usage=end.usage, contract=end.contract, contract_errors=end.contract_errors)
    resilience.charge(streamed.request_id, target, end.outcome, attempt.cost_usd, streamed.tenant)
    resilience.settle(streamed.reservation, (end.prompt_tokens + end.completion_tokens) or streamed.est_tokens)
    record = streamed.record
    if record is None:
        return None
    attempts = list(record.attempts)
    last = max((i for i, a in enumerate(attempts) if a.outcome == "streaming"), default=len(attempts))
    attempts[last : last + 1] = [attempt]
    final = replace(record, attempts=tuple(attempts)).finished(record.chosen, clock=wall or clock)
    decisions.finalise(final)
    observer.recorded(final)
    return final
