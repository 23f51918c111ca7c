"""Wiring of the traffic controls into a gateway replica (serve_apps/gateway.py): the shared board's
client, the per-replica `Traffic`, the standby dry-run, the tiered dispatch and their routes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from cluster.config import SpilloverConfig
from router.capabilities import Registry
from serve_apps.backend import CloudBackend, ModelBackend
from serve_apps.deferral import TieredDispatch
from serve_apps.dispatch import Dispatcher
from serve_apps.dry_run import DryRun
from serve_apps.live_scores import LiveScores
from serve_apps.metrics import GatewayMetrics
from serve_apps.tenant_limits import TenantLimits
from serve_apps.traffic import BoardClient, Traffic
from serve_apps.traffic_metrics import TrafficMetrics
from serve_apps.traffic_routes import TrafficRoutes


@dataclass
class TrafficParts:
    traffic: Traffic
    routes: TrafficRoutes
    config: SpilloverConfig
    metrics: TrafficMetrics
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep)

    def tiered(self, dispatcher: Dispatcher, limits: TenantLimits | None = None) -> TieredDispatch:
        """The dispatcher with degradation tiers; its tickets are served by `routes`, and count
        against the tenants' limits of `limits` (the HTTP edge's)."""
        tickets = self.config.traffic.tickets
        tiers = TieredDispatch(
            dispatcher,
            self.config.policy,
            tickets,
            metrics=self.metrics,
            clock=self.clock,
            sleep=self.sleep,
            cache=self.config.traffic.cache,
            limits=limits,
            # without auth every request is one tenant's: the whole store is its share
            tenant_share=tickets.tenant_share if self.config.gateway.auth else 1.0,
        )
        self.routes.tiers = tiers
        return tiers


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
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> TrafficParts:
    if board is None:
        from serve_apps.traffic_board import RayBoard, get_or_create_traffic_board

        board = RayBoard(get_or_create_traffic_board())
    tm = TrafficMetrics(metrics.registry)
    enabled = [p for p in config.cloud.providers if p.name in providers]
    registry = Registry.from_config(config.models, enabled)
    scores = LiveScores(clock=clock, registry=metrics.registry, prices=prices(registry, config))
    traffic = Traffic(config, board, replica, clock=clock, metrics=tm, scores=scores)
    dry_run = DryRun(registry, local, providers, config.policy, timeout_s=config.traffic.migration.dry_run_timeout_s)
    routes = TrafficRoutes(
        traffic,
        dry_run,
        models=[m.alias for m in config.models],
        targets=[f"local:{m.alias}" for m in config.models] + [f"cloud:{p.name}" for p in enabled],
        scenarios=list(config.policy.scenarios),
        metrics=tm,
    )
    return TrafficParts(traffic, routes, config, tm, clock, sleep)
