"""The dispatcher's deadlines run on the monotonic clock; the wall clock only stamps what people read.

A wall-clock step (NTP, an operator, a VM resumed) while a request waits for local room must neither end
its wait at once (a step forward) nor stretch it (a step back): the wait lasts the request's deadline on
the monotonic clock. The request goes through the real HTTP layer to the real Dispatcher; two fake clocks
stand in for `time.monotonic` and `time.time` (the Dispatcher's defaults), and the injected sleep moves the
monotonic one as a real sleep would, stepping the wall clock by an hour on the first poll.
"""

from __future__ import annotations

import time
from dataclasses import replace

import httpx
import pytest

from cluster.config.deployment import dump_config, load_config, parse_config
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.gateway_parts import GatewayParts
from serve_apps.http.surface import GatewayHTTP, ServedModel
from tests.fakes import FakeClock, FakeEngine
from tests.unit.security_gateway import CHAT, MODEL, REPO

POLL_S = 0.05
SATURATED = ReplicaStats(MODEL, "r1", "n1", 0.0, 0.99, 0, 0, 0, 0, 364, 128)


def test_dispatcher_deadlines_use_monotonic_clock_by_default() -> None:
    cfg = load_config(REPO / "configs/local.yaml")
    dispatcher = Dispatcher(cfg, FakeEngine(), {}, lambda: ClusterSnapshot(taken_at=0.0))
    assert dispatcher._clock is time.monotonic and dispatcher._wall is time.time
    assert dispatcher._admission._clock is time.monotonic


@pytest.mark.timeout(60)
@pytest.mark.parametrize("step_s", [3600.0, -3600.0], ids=["wall_forward_1h", "wall_back_1h"])
async def test_dispatcher_deadlines_use_monotonic_clock(step_s: float) -> None:
    raw = dump_config(load_config(REPO / "configs/local.yaml"))
    raw["resilience"] = {"probes": False}
    cfg = parse_config(raw, "test")
    mono, wall = FakeClock(500.0), FakeClock(1_800_000_000.0)
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        if not sleeps:
            wall.now += step_s  # the step, while the request waits
        sleeps.append(seconds)
        mono.now += seconds
        wall.now += seconds

    def snapshot() -> ClusterSnapshot:  # the poller's fresh, saturated reading, on the wall clock
        return ClusterSnapshot(taken_at=wall.now, replicas=(replace(SATURATED, read_at=wall.now),), max_age_s=1.0)

    local = FakeEngine()
    dispatcher = Dispatcher(cfg, local, {}, snapshot, poll_s=POLL_S, clocks=Clocks.of(mono, wall=wall, sleep=sleep))
    http = GatewayHTTP(
        local, [ServedModel(MODEL, "llama", "cpu", 4096)], dispatcher, created=1, parts=GatewayParts(policy=cfg.policy)
    )
    headers = {"x-spillover-residency": "local_only", "x-spillover-deadline-ms": "2000", "x-request-id": "w-1"}
    transport = httpx.ASGITransport(app=http.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=30) as client:
        started_wall = wall.now
        response = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 429 and response.json()["error"]["code"] == "local_capacity_exhausted"
    assert "no local room after 2.0s" in response.json()["error"]["message"]
    assert sum(sleeps) == pytest.approx(2.0, abs=POLL_S)  # the whole deadline, whatever the wall did
    record = dispatcher.decisions.get("w-1")
    assert record is not None and record.started_at == started_wall  # timestamps stay wall time
    assert record.finished_at is not None and record.finished_at == pytest.approx(started_wall + step_s + 2.0, abs=0.1)
