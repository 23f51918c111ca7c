"""Wiring of the traffic controls into a gateway replica (its composition: serve_apps/gateway_build.py):
the shared board's client, the per-replica `Traffic`, the standby dry-run, the ticket store, the tiered
dispatch and their routes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from cluster.config.deployment import SpilloverConfig
from router.routing.capabilities import Registry
from router.traffic.tickets import TicketStore
from serve_apps.backend import CloudBackend, ModelBackend
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.limits.tenants import TenantLimits
from serve_apps.state.memory import MemoryStore
from serve_apps.state.store import SharedStore
from serve_apps.telemetry.metrics import GatewayMetrics
from serve_apps.traffic.controls import BoardClient, Traffic
from serve_apps.traffic.deferral import Kept, TieredDispatch, response_cache
from serve_apps.traffic.dry_run import DryRun
from serve_apps.traffic.live_scores import LiveScores
from serve_apps.traffic.metrics import TrafficMetrics
from serve_apps.traffic.routes import TrafficRoutes
from serve_apps.traffic.shared_tickets import SharedTickets


@dataclass
class TrafficParts:
    traffic: Traffic
    routes: TrafficRoutes
    tickets: TicketStore  # the deferred requests' answers: kept by the tiered dispatch, read by `routes`
    config: SpilloverConfig
    metrics: TrafficMetrics
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep)

    def tiered(self, dispatcher: Dispatcher, limits: TenantLimits | None = None) -> TieredDispatch:
        """The dispatcher with degradation tiers; its tickets go to the store `routes` reads, and count
        against the tenants' limits of `limits` (the HTTP edge's)."""
        kept = Kept(self.tickets, response_cache(self.config.traffic.cache, self.clock))
        return TieredDispatch(
            dispatcher,
            self.config.policy,
            self.config.traffic.tickets,
            kept,
            metrics=self.metrics,
            clocks=Clocks(self.clock, sleep=self.sleep),
            limits=limits,
        )


def ticket_store(config: SpilloverConfig, clock: Callable[[], float], store: SharedStore | None = None) -> TicketStore:
    """The bounded store of `traffic.tickets` (router/traffic/tickets.py), each ticket also in `store` (the
    gateway's shared store; none: a MemoryStore of its own) for every replica (serve_apps/traffic/shared_tickets.py)."""
    tickets = config.traffic.tickets
    return SharedTickets(
        store if store is not None else MemoryStore(clock=clock),
        max_entries=tickets.max_entries,
        max_bytes=tickets.max_bytes,
        ttl_s=tickets.ttl_s,
        max_wait_s=tickets.max_wait_s,
        clock=clock,
        # without auth every request is one tenant's: the whole store is its share
        tenant_share=tickets.tenant_share if config.gateway.auth else 1.0,
    )


def prices(registry: Registry, config: SpilloverConfig) -> dict[str, float]:
    """Target id -> USD per 1M prompt + 1M output tokens, for the health score's cost component."""
    out: dict[str, float] = {}
    for model in config.models:
        for target in registry.for_alias(model.alias):
            caps = target.caps
            if caps.price_in_per_mtok is not None and caps.price_out_per_mtok is not None:
                out[target.id] = caps.price_in_per_mtok + caps.price_out_per_mtok
    return out


def traffic_parts(
    config: SpilloverConfig,
    local: ModelBackend,
    providers: Mapping[str, CloudBackend],
    metrics: GatewayMetrics,
    replica: str,
    board: BoardClient | None = None,
    *,
    registry: Registry | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    store: SharedStore | None = None,
) -> TrafficParts:
    """The traffic controls of one gateway replica; `registry`: the gateway's one registry of targets
    (its routes included), else one of `config` and `providers`."""
    if board is None:
        from serve_apps.traffic.board import RayBoard, get_or_create_traffic_board

        board = RayBoard(get_or_create_traffic_board())
    tm = TrafficMetrics(metrics.registry)
    enabled = [p for p in config.cloud.providers if p.name in providers]
    registry = registry or Registry.from_config(config.models, enabled, routes=config.routes)
    scores = LiveScores(clock=clock, registry=metrics.registry, prices=prices(registry, config))
    traffic = Traffic(config, board, replica, clock=clock, metrics=tm, scores=scores)
    dry_run = DryRun(registry, local, providers, config.policy, timeout_s=config.traffic.migration.dry_run_timeout_s)
    routes = TrafficRoutes(
        traffic,
        dry_run,
        models=[m.alias for m in config.models],
        targets=[f"local:{m.alias}" for m in config.models] + [f"cloud:{p.name}" for p in enabled],
        scenarios=list(config.policy.scenarios),
        tickets=(tickets := ticket_store(config, clock, store)),
        metrics=tm,
    )
    return TrafficParts(traffic, routes, tickets, config, tm, clock, sleep)
