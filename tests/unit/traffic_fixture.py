"""A gateway with the traffic controls over the shared fakes: the real Dispatcher, Traffic, board,
dry-run, tiered dispatch and routes; a FakeEngine as the local model and two FakeProviders."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

from cluster.config.deployment import SpilloverConfig, parse_config
from router.request.auth import Authenticator, TenantPolicy
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.gateway_parts import EdgeSettings, GatewayParts, OperatorParts
from serve_apps.http.model_card import ServedModel
from serve_apps.http.surface import GatewayHTTP
from serve_apps.limits.tenants import TenantLimits
from serve_apps.resilience.state import Resilience
from serve_apps.state.store import SharedStore
from serve_apps.telemetry.metrics import GatewayMetrics
from serve_apps.traffic.board import LocalBoard, TrafficBoard
from serve_apps.traffic.controls import BoardClient
from serve_apps.traffic.deferral import TieredDispatch
from serve_apps.traffic.wiring import TrafficParts, traffic_parts
from tests.fakes import FakeClock, FakeEngine, FakeProvider
from tests.unit.test_dispatch import SIM_M

PROVIDER_MODEL = SIM_M  # the dispatcher tests' simulated provider model
ADMIN = {"authorization": "Bearer sk-ops"}
APP = {"authorization": "Bearer sk-app"}


def traffic_config(**traffic: Any) -> SpilloverConfig:
    providers = [
        {"name": "sim", "base_url": "http://127.0.0.1:1/v1", "models": {"m": PROVIDER_MODEL}},
        {"name": "spare", "base_url": "http://127.0.0.1:2/v1", "models": {"m": {**PROVIDER_MODEL, "quality": 0.1}}},
    ]
    return parse_config(
        {
            "models": [
                {"alias": "m", "source": "prepared:x", "family": "llama", "engine_args": {"max_model_len": 4096}}
            ],
            "cloud": {"providers": providers},
            "policy": {
                "scenarios": {"default": {}, "digest": {"priority": "non_core"}, "chat": {"priority": "core"}},
            },
            "traffic": {"tickets": {"retry_s": 1, "max_wait_s": 30, "max_entries": 2}, **traffic},
        },
        "test",
    )


@dataclass
class Gw:
    client: httpx.AsyncClient
    clock: FakeClock
    local: FakeEngine
    sim: FakeProvider
    spare: FakeProvider
    parts: TrafficParts
    resilience: Resilience
    board: TrafficBoard


class TrafficWorld:
    """`tenants` (with `auth`): the tenants besides ops (admin, key sk-ops) and app (sk-app); tenant
    `name`'s key is `sk-<name>`. `limits` is the HTTP edge's tenant limits, shared with the tickets."""

    def __init__(self, config: SpilloverConfig, *, auth: bool = False, tenants: tuple[TenantPolicy, ...] = ()) -> None:
        self.clock = FakeClock(1_800_000_000.0)
        self.config = config
        self.local, self.sim, self.spare = FakeEngine(), FakeProvider("sim"), FakeProvider("spare")
        self.board = TrafficBoard(clock=self.clock)
        self.tiers: TieredDispatch | None = None  # the latest gateway's tiered dispatch
        self.kv = 0.1  # the local replica's KV usage
        self.resume = asyncio.Event()  # deferred requests' background attempts wait for it
        policies = [TenantPolicy("ops", admin=True), *tenants]
        policies += [TenantPolicy("app")] if all(t.name != "app" for t in tenants) else []
        self.auth = Authenticator(policies, {t.name: f"sk-{t.name}" for t in policies}) if auth else None
        self.limits = TenantLimits()

    def snapshot(self) -> ClusterSnapshot:
        replica = ReplicaStats("m", "r1", "n1", self.clock.now, self.kv, 0, 0, 0, 0, 364, 128)
        return ClusterSnapshot(taken_at=self.clock.now, replicas=(replica,), max_age_s=1.0)

    async def sleep(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await asyncio.sleep(0)

    async def ticket_sleep(self, seconds: float) -> None:
        await self.resume.wait()
        self.clock.advance(seconds)

    def gateway(
        self, replica: str = "r-a", store: SharedStore | None = None, board: BoardClient | None = None
    ) -> tuple[GatewayHTTP, TrafficParts, Resilience]:
        """`store`: the shared store its tickets also go to (serve_apps/traffic/shared_tickets.py); none: its own.
        `board`: the client of the traffic board (default: this world's board, in process)."""
        providers = {"sim": self.sim, "spare": self.spare}
        metrics = GatewayMetrics()
        board = board or LocalBoard(self.board)
        parts = traffic_parts(
            self.config,
            self.local,
            providers,
            metrics,
            replica,
            board,
            clock=self.clock,
            sleep=self.ticket_sleep,
            store=store,
        )
        res = Resilience(self.config, clock=self.clock)
        dispatcher = Dispatcher(
            self.config,
            self.local,
            providers,
            self.snapshot,
            clocks=Clocks.of(self.clock, sleep=self.sleep),
            parts=DispatchParts(resilience=res, traffic=parts.traffic),
        )
        tiered = self.tiers = parts.tiered(dispatcher, self.limits)
        http = GatewayHTTP(
            self.local,
            [ServedModel("m", "llama", "cpu", 4096)],
            tiered,
            created=1,
            edge=EdgeSettings(authenticator=self.auth),
            parts=GatewayParts(
                policy=self.config.policy, decisions=dispatcher.decisions, metrics=metrics, tenant_limits=self.limits
            ),
            operator=OperatorParts(traffic=parts.routes),
        )
        return http, parts, res

    def client(self, http: GatewayHTTP) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=http.app), base_url="http://gw")
