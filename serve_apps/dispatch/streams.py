"""The stream a client reads once the dispatcher has a target's first byte: counted and checked as it
passes (serve_apps/streams/account.py, serve_apps/streams/contract.py), booked when it ends
(serve_apps/streams/record.py; a graded switch's gates see how it ended), and — when the scenario
continues streams — spliced onto the next target that accepts a prefill if it breaks
(serve_apps/streams/continuation.py). Nothing is re-sent after the first byte otherwise."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from cluster.config.deployment import SpilloverConfig
from router.learning.decision import DecisionRecord, DecisionStore
from router.output.tool_calls import StreamedMessage
from router.request.contract import RequestContract
from router.request.openai_request import Kind
from router.routing.capabilities import Target
from serve_apps.backend import BackendReply
from serve_apps.clocks import Clocks
from serve_apps.dispatch.interfaces import DispatchObserver
from serve_apps.off_loop.check_pool import CheckRunner
from serve_apps.resilience.state import Resilience
from serve_apps.streams.account import StreamEnd, Tally, accounted
from serve_apps.streams.continuation import Splicer, StreamJob
from serve_apps.streams.contract import end_check
from serve_apps.streams.record import StreamedAttempt, book_stream_end
from serve_apps.traffic.controls import Traffic


@dataclass(frozen=True)
class Started:
    """One attempt whose stream has begun, and what a continuation may use."""

    kind: Kind
    contract: RequestContract
    body: dict[str, Any]  # as sent to cloud targets
    local_body: dict[str, Any]  # as sent to local targets
    streamed: StreamedAttempt
    chunks: AsyncIterator[str]
    rest: Sequence[Target]  # the candidates after it
    deadline: float
    attempts_made: int
    client_usage: bool  # the client asked for the usage chunk
    ended: Callable[[StreamEnd, StreamedMessage], None] | None = (
        None  # the session's turn (serve_apps/sessions/turns.py)
    )


class ClientStreams:
    def __init__(
        self,
        config: SpilloverConfig,
        continuation: Callable[[Target, dict[str, Any], str], Awaitable[BackendReply]],
        *,
        resilience: Resilience,
        decisions: DecisionStore,
        observer: DispatchObserver,
        traffic: Traffic | None,
        checks: CheckRunner,
        clocks: Clocks,
    ) -> None:
        self._config = config
        self._checks = checks  # the schema-check pool (serve_apps/off_loop/check_pool.py)
        self._resilience = resilience
        self._decisions = decisions
        self._observer = observer
        self._clock = clocks.clock  # latencies and the deadline (monotonic)
        self._wall = clocks.wall  # the record's finished_at
        self._traffic = traffic
        self._splicer = Splicer(
            call=continuation,
            resilience=resilience,
            decisions=decisions,
            observer=observer,
            clock=clocks.clock,
            max_attempts=resilience.max_attempts,
        )

    def reply(self, s: Started) -> BackendReply:
        scenario = self._config.policy.scenarios.get(s.contract.scenario)
        continues = s.kind == "chat" and scenario is not None and scenario.continues_streams(s.contract.level)
        target = s.streamed.target
        job = StreamJob(
            s.streamed.request_id,
            s.contract,
            s.body,
            s.local_body,
            target,
            s.chunks,
            s.rest,
            s.deadline,
            continues,
            s.attempts_made,
            client_usage=s.client_usage,
        )
        return BackendReply(chunks=self._splicer.stream(self._observed(s), job))

    def _observed(self, s: Started) -> AsyncIterator[str]:
        """The stream as the client gets it, counted and checked, its outcome booked when it ends."""
        booked = partial(
            book_stream_end,
            s.streamed,
            resilience=self._resilience,
            decisions=self._decisions,
            observer=self._observer,
            clock=self._clock,
            wall=self._wall,
        )
        contract = s.contract
        tally = Tally(drop_usage=not s.client_usage)

        def book(end: StreamEnd) -> DecisionRecord | None:
            final = booked(end)
            if self._traffic is not None and final is not None:
                self._traffic.observed(contract, final.attempts)  # the switch's gates see how it ended
            if s.ended is not None:
                s.ended(end, tally.message)  # a session's anchor and stored history get the answer
            return final

        check = end_check(s.kind, contract, s.streamed.target, self._checks)
        return accounted(s.chunks, tally, contract.est_prompt_tokens, book, check)
