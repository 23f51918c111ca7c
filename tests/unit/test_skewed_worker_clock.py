"""A worker whose clock is an hour off the head's: its engine stats stay fresh while it pushes and go stale
when it stops, exactly as for a worker in sync. Freshness is measured by the receivers' clocks — the board
notes when a push arrived on its own monotonic clock, the gateway's poller rebuilds `read_at` on its own —
never by comparing the worker's `read_at` with the gateway's time.

The path is the real one minus Ray: the replica's `push_forever` loop (serve_apps/telemetry/stats_pusher.py) pushes
`ReplicaStats` stamped by its skewed clock into the board's `BoardState` (the TelemetryBoard actor's
body, called through a stand-in for the actor handle), the real `BoardReader` reads it, and the gateway's
HTTP layer answers `GET /v1/spillover/cluster` and routes a chat by that snapshot.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from cluster.config.deployment import load_config
from router.routing.snapshot import ReplicaStats
from router.routing.watermarks import Watermarks
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.gateway_parts import GatewayParts, OperatorParts
from serve_apps.http.surface import GatewayHTTP, ServedModel
from serve_apps.telemetry.board import BoardState
from serve_apps.telemetry.board_reader import BoardReader
from serve_apps.telemetry.stats_pusher import push_forever
from tests.fakes import FakeClock, FakeEngine
from tests.unit.security_gateway import CHAT, MODEL, REPO

HOUR = 3600.0


class Method:
    """`handle.method.remote(*args)` of a Ray actor handle, over a local object: an awaitable result."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def remote(self, *args: Any) -> Any:
        async def call() -> Any:
            return self._fn(*args)

        return call()


class BoardHandle:
    def __init__(self, board: BoardState) -> None:
        self.push, self.snapshot = Method(board.push), Method(board.snapshot)


def reading(clock: FakeClock) -> ReplicaStats:
    return ReplicaStats(MODEL, "r-skewed", "worker-1", clock(), 0.1, 0, 0, 0, 0, 364, 128)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("skew_s", [-HOUR, HOUR], ids=["worker_1h_behind", "worker_1h_ahead"])
async def test_skewed_worker_clock_not_stale(skew_s: float) -> None:
    gateway_wall = FakeClock(1_800_000_000.0)
    worker_wall = FakeClock(gateway_wall.now + skew_s)  # what `time.time()` says on the worker
    board_clock = FakeClock(50.0)  # the head's monotonic clock
    board = BoardState(forget_after_s=60.0, clock=board_clock)
    handle = BoardHandle(board)
    config = load_config(REPO / "configs/local.yaml")
    poller = BoardReader(
        handle, min_interval_s=0.2, max_age_s=1.0, watermarks_for=lambda _: Watermarks(), clock=gateway_wall
    )

    stopped = asyncio.Event()

    async def read() -> ReplicaStats:
        if stopped.is_set():  # the worker stops pushing for good: parked here, even if the cancel below is lost
            await asyncio.Event().wait()
        return reading(worker_wall)

    pusher = asyncio.create_task(push_forever(read, handle, period_s=0.001))
    try:
        while not board.snapshot():
            await asyncio.sleep(0.001)
    finally:
        # Python 3.11's wait_for (the push's bound) returns a result that was ready when a cancel came, and the
        # cancel is lost: the loop went on pushing, and on a loaded machine a push landed after the clocks below
        # moved (seen once: the reading kept at exactly forget_after_s)
        stopped.set()
        pusher.cancel()
        await asyncio.wait({pusher}, timeout=1.0)
    await poller.refresh()

    local = FakeEngine(answer="from local")
    dispatcher = Dispatcher(config, local, {}, poller.latest, clocks=Clocks.of(gateway_wall))
    http = GatewayHTTP(
        local,
        [ServedModel(MODEL, "llama", "cpu", 4096)],
        dispatcher,
        created=1,
        parts=GatewayParts(policy=config.policy),
        operator=OperatorParts(snapshot=poller.latest, clock=gateway_wall),
    )
    transport = httpx.ASGITransport(app=http.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=30) as client:
        (replica,) = (await client.get("/v1/spillover/cluster")).json()["replicas"]
        assert replica["stale"] is False and replica["age_s"] < 1.0  # pushing: fresh, an hour of skew or not
        chat = await client.post("/v1/chat/completions", json=CHAT)
        assert chat.status_code == 200 and chat.headers["x-spillover-route"] == "local"

        # the worker stops pushing: two seconds later (head and gateway clocks alike) its reading is stale
        board_clock.now += 2.0
        gateway_wall.now += 2.0
        await poller.refresh()
        (replica,) = (await client.get("/v1/spillover/cluster")).json()["replicas"]
        assert replica["stale"] is True and replica["age_s"] == pytest.approx(2.0)

        board_clock.now += 60.0  # and past forget_after_s on the board's own clock it is gone
        await poller.refresh()
        assert (await client.get("/v1/spillover/cluster")).json()["replicas"] == []


def test_skewed_worker_clock_not_stale_with_a_board_from_before() -> None:
    """A row without the board's age (a detached board started by an older release) keeps its `read_at`."""
    clock = FakeClock(100.0)
    row = reading(clock).to_dict()
    poller = BoardReader(
        BoardHandle(BoardState()), min_interval_s=1, max_age_s=1, watermarks_for=lambda _: Watermarks(), clock=clock
    )
    poller._board = type("Old", (), {"snapshot": Method(lambda now: [row])})()
    snapshot = asyncio.run(poller.refresh())
    assert snapshot.replicas[0].read_at == 100.0
