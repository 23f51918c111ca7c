"""Metrics of the traffic controls, in the gateway's own registry (serve_apps/telemetry/metrics.py):

spillover_migration_share{scope,target}          share of the scope's primary traffic the switch's new target takes
spillover_migration_events_total{scope,kind}     switch steps: started | step | held | rolled_back | complete
spillover_dry_runs_total{target,outcome}         standby dry-runs before a switch (passed | failed)
spillover_degraded_total{model,mode}             requests answered in a degraded mode (deferred | shed)
spillover_tickets{state}                         deferred requests' tickets kept (pending | finished)
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge


class TrafficMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.share = Gauge(
            "spillover_migration_share", "Share the switch's new target takes", ["scope", "target"], registry=r
        )
        self.events = Counter(
            "spillover_migration_events", "Graded switch steps, holds and rollbacks", ["scope", "kind"], registry=r
        )
        self.dry_runs = Counter("spillover_dry_runs", "Standby dry-runs", ["target", "outcome"], registry=r)
        self.degraded = Counter("spillover_degraded", "Requests in a degraded mode", ["model", "mode"], registry=r)
        self.tickets = Gauge("spillover_tickets", "Tickets of deferred requests", ["state"], registry=r)

    def migration(self, scope: str, target: str, share: float, kinds: Iterable[str]) -> None:
        self.share.labels(scope, target).set(share)
        for kind in kinds:
            self.events.labels(scope, kind).inc()

    def dry_run(self, target: str, passed: bool) -> None:
        self.dry_runs.labels(target, "passed" if passed else "failed").inc()

    def degrade(self, model: str, mode: str) -> None:
        self.degraded.labels(model, mode).inc()

    def ticket_counts(self, pending: int, total: int) -> None:
        self.tickets.labels("pending").set(pending)
        self.tickets.labels("finished").set(total - pending)
