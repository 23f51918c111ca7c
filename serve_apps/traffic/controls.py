"""One gateway replica's side of the operator's traffic controls and graded switches.

The operator's document (router/traffic/traffic.py) lives in the shared `TrafficBoard` actor
(serve_apps/traffic/board.py); every `traffic.sync_period_s` this replica pushes what its own gates
decided (a rollback, a completed switch) and pulls the document back. From it:

* drains and pins make targets unavailable at plan time (`unavailable`, with the reason in the
  decision record);
* a running switch gets a `Migration` (router/traffic/migration.py) here, adopted at once by the first
  `migration.stagger_share` of the replicas and `migration.stagger_s` later by the rest
  (`stagger_delay_s`); `arrange` puts the standby first for its share of the requests that would have
  gone to the primary (a deterministic split), and says so in the decision record
  (`x-spillover-traffic`);
* before that, `arrange` applies the live routing weight (serve_apps/traffic/weight_routing.py): a degraded
  first candidate keeps only its weight's share of new requests, the rest go to the next one;
* `observed` feeds every attempt's outcome to the gates; before each widening the standby's quota
  (its provider's `rpm` / `tpm`) must hold the expected load; a rollback here is reported to the
  board, so every replica rolls back at its next sync.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from cluster.config.deployment import SpilloverConfig
from router.learning.decision import Attempt
from router.request.contract import RequestContract
from router.routing.capabilities import Target
from router.traffic import traffic as doc_ops
from router.traffic.migration import Gates, Migration, splitter, stagger_delay_s
from serve_apps.traffic.live_scores import LiveScores
from serve_apps.traffic.metrics import TrafficMetrics
from serve_apps.traffic.weight_routing import WeightRouting

log = logging.getLogger("spillover.traffic")
RATE_WINDOW_S = 60.0


class BoardClient(Protocol):
    """The shared board (a Ray actor in production, `TrafficBoard` itself in tests)."""

    async def sync(self, replica: str, reports: list[tuple[str, str, str, str]]) -> tuple[dict[str, Any], float]: ...

    async def command(self, command: doc_ops.Command, switch_id: str) -> tuple[dict[str, Any], str]: ...

    async def record(self, action: str, scope: str, said: str) -> dict[str, Any]: ...


@dataclass
class _Adopted:
    switch_id: str
    migration: Migration
    adopt_at: float
    count: int = 0
    reported: int = 0  # events already shown to metrics


class Traffic:
    def __init__(
        self,
        config: SpilloverConfig,
        board: BoardClient,
        replica: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        metrics: TrafficMetrics | None = None,
        scores: LiveScores | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        m = config.traffic.migration
        self._gates: Gates = m  # the config section extends the gates
        self._stagger = (m.stagger_share, m.stagger_s)
        self._limits = {p.name: (p.rpm, p.tpm) for p in config.cloud.providers}
        self._board = board
        self._replica = replica
        self._clock = clock
        self._metrics = metrics
        self._wall = wall  # event times are shown as epoch seconds, like the board's history
        self.scores = scores or LiveScores(clock=clock)  # health score per target x scenario, live latency
        self.weights = WeightRouting(self.scores)  # the score's weight as a share of new requests
        self.doc: dict[str, Any] = doc_ops.empty_doc()
        self.position = 0.0
        self._adopted: dict[str, _Adopted] = {}
        self._reports: list[tuple[str, str, str, str]] = []  # scope, switch id, phase, reason
        self._arrivals: dict[str, deque[tuple[float, int]]] = {}  # scope -> (time, tokens) per request
        self.on_observed: list[Callable[[RequestContract, Sequence[Attempt]], None]] = []  # each request's end

    # -- the shared document -----------------------------------------------------------------------
    async def sync_once(self) -> None:
        reports, self._reports = self._reports, []
        try:
            doc, position = await self._board.sync(self._replica, reports)
        except BaseException:
            self._reports = reports + self._reports  # told next time
            raise
        self.adopt(doc, position)
        self.tick_all()
        self.scores.tick()

    async def command(self, command: doc_ops.Command, switch_id: str = "") -> str:
        doc, said = await self._board.command(command, switch_id)
        self.adopt(doc, self.position)
        return said

    async def record(self, action: str, scope: str, said: str) -> None:
        """An event in the shared history that changes nothing (a switch its dry-run refused)."""
        self.adopt(await self._board.record(action, scope, said), self.position)

    async def run(self, period_s: float, sleep: Callable[[float], Awaitable[None]]) -> None:
        while True:
            try:
                await self.sync_once()
            except Exception as exc:  # noqa: BLE001 -- the board being away must not stop the gateway
                log.warning("traffic board unavailable: %s", type(exc).__name__)
            await sleep(period_s)

    def adopt(self, doc: dict[str, Any], position: float) -> None:
        """Follow the board's document: new switches get a Migration, rollbacks and clears apply."""
        self.doc, self.position = doc, position
        switches: Mapping[str, Any] = doc.get("switches", {})
        for scope in [s for s, a in self._adopted.items() if switches.get(s, {}).get("id") != a.switch_id]:
            del self._adopted[scope]
        for scope, switch in switches.items():
            adopted = self._adopted.get(scope)
            if adopted is None:
                gates = self._gates_for(switch)
                migration = Migration(switch["primary"], switch["standby"], gates, self._clock)
                delay = stagger_delay_s(position, first_share=self._stagger[0], stagger_s=self._stagger[1])
                adopted = self._adopted[scope] = _Adopted(switch["id"], migration, self._clock() + delay)
                if switch["phase"] == "complete":
                    migration.phase, adopted.adopt_at = "complete", self._clock()
            if switch["phase"] == "rolled_back":
                adopted.migration.rollback(switch["reason"])
            self._show(scope, adopted)

    def _gates_for(self, switch: Mapping[str, Any]) -> Gates:
        g = self._gates
        step_s = g.step_s if switch.get("step_s") is None else float(switch["step_s"])
        min_requests = g.min_requests if switch.get("min_requests") is None else int(switch["min_requests"])
        return Gates(
            **{**{f: getattr(g, f) for f in Gates.model_fields}, "step_s": step_s, "min_requests": min_requests}
        )

    # -- plan and attempt time ---------------------------------------------------------------------
    def unavailable(self, contract: RequestContract, targets: Iterable[Target]) -> dict[str, str]:
        return doc_ops.unavailable(self.doc, contract, targets)

    def arrange(
        self, contract: RequestContract, candidates: Sequence[tuple[Target, str]]
    ) -> tuple[list[tuple[Target, str]], str]:
        """The candidates after the live weight and a graded switch; what either did, in words."""
        weighed, weight_note = self.weights.arrange(contract.scenario, candidates)
        out, switch_note = self._switched(contract, weighed)
        return out, "; ".join(n for n in (weight_note, switch_note) if n)

    def _switched(
        self, contract: RequestContract, candidates: Sequence[tuple[Target, str]]
    ) -> tuple[list[tuple[Target, str]], str]:
        """The candidates with the standby first for its share of the primary's requests; a note."""
        found = doc_ops.switch_for(self.doc, contract)
        out = list(candidates)
        if found is None or not out:
            return out, ""
        scope = found[0]
        adopted = self._adopted.get(scope)
        if adopted is None:
            return out, ""
        self._arrived(scope, contract.est_prompt_tokens + contract.max_output_tokens)
        migration = adopted.migration
        if out[0][0].endpoint != migration.old:
            return out, ""
        standby = next((i for i, (t, _) in enumerate(out) if t.endpoint == migration.new), None)
        if self._clock() < adopted.adopt_at:
            return out, f"{scope}: switch to {migration.new} not yet adopted here (staggered)"
        share = migration.share()
        chosen = splitter(share, adopted.count)
        adopted.count += 1
        note = f"{scope}: {migration.old} -> {migration.new} {migration.phase} at {share:.0%}"
        if not chosen or standby is None:
            return out, note + (": primary" if standby is not None else ": standby not capable or unavailable")
        moved = out.pop(standby)
        why = f"graded switch to {migration.new} ({share:.0%})"
        return [(moved[0], why), *[(t, r or "") for t, r in out]], note + ": standby"

    def observed(self, contract: RequestContract, attempts: Iterable[Attempt]) -> None:
        attempts = list(attempts)
        for hook in self.on_observed:  # the pooled evidence (serve_apps/learning/pooled_evidence.py)
            hook(contract, attempts)
        self._observe(contract.model, contract.scenario, attempts)

    def observed_elsewhere(self, model: str, scenario: str, tokens: int, attempts: Sequence[Attempt]) -> None:
        """Another gateway replica's finished request: its outcome feeds the scores and gates here too, and
        it counts as an arrival in its switch's window (the standby's quota check sees every replica's load)."""
        found = doc_ops.switch_of(self.doc, model, scenario)
        if found is not None and found[0] in self._adopted:
            self._arrived(found[0], tokens)
        self._observe(model, scenario, attempts)

    def _observe(self, model: str, scenario: str, attempts: Sequence[Attempt]) -> None:
        self.scores.observe(scenario, attempts)
        found = doc_ops.switch_of(self.doc, model, scenario)
        if found is None or (adopted := self._adopted.get(found[0])) is None:
            return
        migration = adopted.migration
        for attempt in attempts:
            if attempt.outcome == "skipped":
                continue
            migration.observe(
                doc_ops.endpoint_of(attempt.target),
                ok=attempt.outcome == "ok",
                violation=attempt.outcome == "contract_violation",
                latency_s=attempt.latency_s,
            )
        migration.tick(partial(self._quota_refusal, found[0], migration.new))
        self._show(found[0], adopted)

    def forget(self, endpoint: str | None = None) -> list[str]:
        """An operator's resilience reset: the live scores of one health key (or all) are forgotten,
        so their routing weights are 100 again."""
        if endpoint is None:
            self.weights.reset()
        return self.scores.reset(endpoint)

    def tick_all(self) -> None:
        """Time-driven steps for scopes without traffic right now (called at each sync)."""
        for scope, adopted in self._adopted.items():
            adopted.migration.tick(partial(self._quota_refusal, scope, adopted.migration.new))
            self._show(scope, adopted)

    # -- internals ---------------------------------------------------------------------------------
    def _arrived(self, scope: str, tokens: int) -> None:
        now = self._clock()
        window = self._arrivals.setdefault(scope, deque())
        window.append((now, tokens))
        while window and window[0][0] < now - RATE_WINDOW_S:
            window.popleft()
        while len(window) > 100_000:
            window.popleft()

    def _quota_refusal(self, scope: str, standby: str, share: float) -> str | None:
        """Why the standby could not take `share` of the scope's recent load (its RPM / TPM)."""
        if not standby.startswith("cloud:"):
            return None
        rpm, tpm = self._limits.get(standby.removeprefix("cloud:"), (None, None))
        window = self._arrivals.get(scope, ())
        requests, tokens = len(window) * share, sum(t for _, t in window) * share
        if rpm is not None and requests > rpm:
            return f"standby {standby} rpm {rpm:g} < {requests:.0f} requests/min expected at {share:.0%}"
        if tpm is not None and tokens > tpm:
            return f"standby {standby} tpm {tpm:g} < {tokens:.0f} tokens/min expected at {share:.0%}"
        return None

    def _show(self, scope: str, adopted: _Adopted) -> None:
        migration = adopted.migration
        fresh = migration.events[adopted.reported :] if adopted.reported <= len(migration.events) else []
        adopted.reported = len(migration.events)
        for event in fresh:
            log.info("switch %s: %s", scope, event.reason)
            if event.kind in ("rolled_back", "complete") and self.doc["switches"].get(scope, {}).get("phase") == (
                "running"
            ):
                self._reports.append((scope, adopted.switch_id, event.kind, event.reason))
        if self._metrics is not None:
            self._metrics.migration(scope, migration.new, migration.share(), [e.kind for e in fresh])

    def view(self) -> dict[str, Any]:
        now = self._clock()
        return {
            **self.doc,
            "replica": {"id": self._replica, "position": self.position},
            "scores": self.scores.view(),
            "migrations": {
                scope: {
                    **a.migration.view(self._wall() - now),
                    "adopted": now >= a.adopt_at,
                    "adopt_in_s": max(0.0, a.adopt_at - now),
                }
                for scope, a in self._adopted.items()
            },
        }
