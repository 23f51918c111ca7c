"""Learning pooled across gateway replicas: each replica learns from every replica's traffic.

Behind one address, N gateway replicas each see 1/N of the requests. What they learn from them — the quality
book's evidence and feedback (router/learning/quality.py), the live health scores and the graded-switch gates
with their arrival windows (serve_apps/traffic/controls.py) — would each rest on 1/N of the evidence, and a
canary's gates would judge 1/N of its traffic. So every replica also sends what it observed to one bounded log
in the shared store (serve_apps/state/store.py `log_append`) and applies what the others sent
(`log_after`, from the last entry it read), as if it had seen those requests itself:

* its own observations go into its book at once, as before, and are queued for the others (no store
  operation on the request path); every `learning.pool.period_s` one batch goes out and the others' new
  entries come in: together every replica's evidence, eventually (within about two periods);
* a replica that starts reads the whole log (`learning.pool.max_events`), so a restarted or added replica
  starts from the cluster's quality evidence, not the configured priors. Outcomes older than
  `learning.pool.live_horizon_s` do not move live scores or gates: those are about now;
* an entry is checked before it is applied (serve_apps/learning/evidence_events.py): one that is not what a
  gateway of this config writes is counted and skipped;
* while the store is down (serve_apps/state/fallback.py) nothing goes out or comes in: each replica learns
  from its own traffic, and reads on where it stopped once the store is back.

What is pooled is evidence, not conclusions: the books stay each replica's own, fed the same events, so they
agree up to the order events arrived and the bounds each keeps (`max_buckets`, `latency_window`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from router.learning.decision import Attempt, DecisionRecord
from router.learning.quality import bucket_key
from router.request.contract import RequestContract
from serve_apps.learning.evidence_events import (
    FeedbackEvent,
    OutcomeEvent,
    QualityEvent,
    Vocabulary,
    feedback_event,
    outcome_event,
    parse,
    quality_event,
)
from serve_apps.learning.state import FeedbackEvidence
from serve_apps.state.store import SharedStore

log = logging.getLogger("spillover.learning")

LOG_KEY = "learning:evidence"
MAX_QUEUED = 10_000  # observations waiting for the next send; past it the oldest are not sent
READ_BATCH = 500
MAX_READ_PER_ROUND = 4_000  # entries applied per period: a long log is caught up over several


@dataclass(frozen=True)
class EvidenceSinks:
    """Where another replica's evidence goes: the same entry points this replica's own goes through."""

    quality: Callable[[str, Sequence[tuple[str, str, float]]], None] | None  # QualityBook.observe_attempts
    feedback: Callable[[FeedbackEvent], None] | None
    outcome: Callable[[str, str, int, Sequence[Attempt]], None] | None  # Traffic.observed_elsewhere


@dataclass(frozen=True)
class PoolSettings:
    period_s: float = 1.0
    max_events: int = 20_000
    live_horizon_s: float = 60.0


@dataclass
class PoolCounts:
    sent: int = 0
    applied: int = 0
    skipped_own: int = 0
    rejected: int = 0  # entries that were not events of this gateway's config
    stale: int = 0  # outcomes past the live horizon (their quality evidence still applied)
    dropped: int = 0  # observations never sent (the queue was full)

    def totals(self) -> dict[str, int]:
        """For `spillover_learning_evidence_total{kind}`."""
        return {
            "sent": self.sent,
            "applied": self.applied,
            "rejected": self.rejected,
            "stale": self.stale,
            "dropped": self.dropped,
        }


class EvidencePool:
    def __init__(
        self,
        store: SharedStore,
        replica: str,
        vocabulary: Vocabulary,
        sinks: EvidenceSinks,
        *,
        wall: Callable[[], float],
        settings: PoolSettings | None = None,
        on_exchanged: Callable[[PoolCounts], None] | None = None,
    ) -> None:
        self._store = store
        self._replica = replica
        self._vocab = vocabulary
        self._sinks = sinks
        self._wall = wall
        self.settings = settings or PoolSettings()
        self._queue: deque[bytes] = deque()
        self._after: str | None = None  # the last entry read
        self.counts = PoolCounts()
        self._on_exchanged = on_exchanged  # after every round, e.g. the metrics' totals
        self._warned = False

    # -- this replica's observations (hooks, on the event loop; never a store operation) ---------------------
    def recorded(self, record: DecisionRecord) -> None:
        attempts = [(a.target, a.outcome, a.latency_s) for a in record.attempts if a.outcome != "skipped"]
        if attempts:
            self._queued(quality_event(self._replica, bucket_key(record.contract), attempts))

    def feedback(self, given: FeedbackEvidence) -> None:
        event = feedback_event(self._replica, given.bucket, given.target, given.success, given.owner, given.shared)
        self._queued(event)

    def observed(self, contract: RequestContract, attempts: Sequence[Attempt]) -> None:
        tried = [a for a in attempts if a.outcome != "skipped"]
        if tried:
            tokens = contract.est_prompt_tokens + contract.max_output_tokens
            self._queued(outcome_event(self._replica, contract.model, contract.scenario, tokens, self._wall(), tried))

    def _queued(self, event: bytes) -> None:
        self._queue.append(event)
        while len(self._queue) > MAX_QUEUED:
            self._queue.popleft()
            self.counts.dropped += 1

    # -- the exchange ------------------------------------------------------------------------------------------
    async def exchange(self) -> None:
        """Send what was queued, then apply the others' new entries (one period's work)."""
        await self._send()
        await self._receive()

    async def _send(self) -> None:
        if not self._queue:
            return
        batch = list(self._queue)
        self._queue.clear()  # sent, or with the store down dropped by it on purpose: nobody would read them
        await self._store.log_append(LOG_KEY, batch, self.settings.max_events)
        self.counts.sent += len(batch)

    async def _receive(self) -> None:
        read = 0
        while read < MAX_READ_PER_ROUND:
            entries = await self._store.log_after(LOG_KEY, self._after, READ_BATCH)
            for entry, raw in entries:
                self._after = entry
                self._apply(raw)
            read += len(entries)
            if len(entries) < READ_BATCH:
                return

    def _apply(self, raw: bytes) -> None:
        event = parse(raw, self._vocab)
        if event is None:
            self.counts.rejected += 1
            if not self._warned:
                self._warned = True
                log.warning("pooled learning evidence: an entry that is not an event of this config was skipped")
            return
        if event.replica == self._replica:
            self.counts.skipped_own += 1
            return
        sinks = self._sinks
        if isinstance(event, QualityEvent):
            if sinks.quality is not None:
                sinks.quality(event.bucket, event.attempts)
        elif isinstance(event, FeedbackEvent):
            if sinks.feedback is not None:
                sinks.feedback(event)
        elif isinstance(event, OutcomeEvent):
            if self._wall() - event.wall > self.settings.live_horizon_s:
                self.counts.stale += 1
                return
            if sinks.outcome is not None:
                sinks.outcome(event.model, event.scenario, event.tokens, event.attempts)
        self.counts.applied += 1

    async def run(self, sleep: Callable[[float], Awaitable[None]]) -> None:
        while True:
            try:
                await self.exchange()
            except Exception:  # learning from the others must never stop the gateway
                log.exception("pooled learning evidence: exchange failed")
            if self._on_exchanged is not None:
                self._on_exchanged(self.counts)
            await sleep(self.settings.period_s)
