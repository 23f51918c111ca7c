"""The dispatcher: local vs cloud vs waiting room, admission counts, fallback before the first byte."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from cluster.config.deployment import SpilloverConfig, parse_config
from router.errors import (
    LocalCapacityExhausted,
    RequestError,
    TargetUnavailable,
)
from router.request.contract import RequestContract, derive_contract
from router.request.openai_request import Kind
from router.routing.policy import Policy
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.backend import BackendReply
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from tests.fakes import FakeEngine, FakeProvider, completion

T0 = 5000.0


SIM_M = {
    "name": "sim-m",
    "snapshot": "sim-m-1",
    "context_window": 32768,
    "region": "us",
    "tools": True,
    "json_schema": True,
    "price_in_per_mtok": 0.1,
    "price_out_per_mtok": 0.4,
    "data_policy": "no_retention",  # L1 requests may use it
}


def make_config(**model: Any) -> SpilloverConfig:
    return parse_config(
        {
            "admission": {"queue_max": 2, "queue_timeout_s": 5},
            "models": [
                {
                    "alias": "m",
                    "source": "prepared:x",
                    "family": "llama",
                    "engine_args": {"max_model_len": 4096},
                    **model,
                }
            ],
            "cloud": {"providers": [{"name": "sim", "base_url": "http://127.0.0.1:1/v1", "models": {"m": SIM_M}}]},
        },
        "test",
    )


def contract_for(body: dict[str, Any], **headers: str) -> RequestContract:
    return derive_contract({"model": "m", **body}, {k.replace("_", "-"): v for k, v in headers.items()}, Policy())


async def run(d: Dispatcher, kind: Kind, body: dict[str, Any], request_id: str, deadline_s: float = 5, **headers: str):
    return await d.dispatch(kind, body, request_id, contract=contract_for(body, **headers), deadline_s=deadline_s)


def stats(kv: float = 0.1, read_at: float = T0, blocks: int = 364) -> ReplicaStats:
    return ReplicaStats("m", "r1", "n1", read_at, kv, 0, 0, 0, 0, blocks, 128)


class World:
    """Fake clock + snapshot; `sleep` advances time and applies scheduled changes."""

    def __init__(self) -> None:
        self.now = T0
        self.replica = stats()
        self.changes: dict[int, ReplicaStats] = {}
        self.sleeps = 0

    def clock(self) -> float:
        return self.now

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(taken_at=self.now, replicas=(replace(self.replica, read_at=self.now),), max_age_s=1.0)

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        if self.sleeps in self.changes:
            self.replica = self.changes[self.sleeps]


class Observer:
    def __init__(self) -> None:
        self.max_waiting = 0
        self.outcomes: list[str] = []
        self.decisions = 0
        self.records: list[str] = []

    def waiting(self, model: str, count: int) -> None:
        self.max_waiting = max(self.max_waiting, count)

    def waited(self, model: str, seconds: float, outcome: str) -> None:
        self.outcomes.append(outcome)

    def decided(self, seconds: float) -> None:
        self.decisions += 1

    def recorded(self, record: Any) -> None:
        self.records.append(record.request_id)


@pytest.fixture
def world() -> World:
    return World()


def dispatcher(world: World, config: SpilloverConfig | None = None, **parts: Any) -> Dispatcher:
    return Dispatcher(
        config or make_config(),
        parts.get("local") or FakeEngine(),
        {"sim": parts.get("cloud") or FakeProvider()},
        world.snapshot,
        poll_s=0.1,
        clocks=Clocks.of(world.clock, sleep=world.sleep),
        parts=DispatchParts(observer=parts.get("observer")),
    )


CHAT = {"messages": [{"role": "user", "content": "hi"}]}


async def test_low_load_stays_local(world: World) -> None:
    d = dispatcher(world)
    done = await run(d, "chat", CHAT, "r-1", deadline_s=5)
    assert (done.route, done.target, done.reply.body) == ("local", "local:m", completion("m", "Paris"))
    assert d.inflight("m") == 0


async def test_stream_counts_inflight_until_consumed(world: World) -> None:
    d = dispatcher(world)
    done = await run(d, "chat", {**CHAT, "stream": True}, "r-1", deadline_s=5)
    assert d.inflight("m") == 1
    assert [c async for c in done.reply.chunks][-1] == "data: [DONE]\n\n"  # type: ignore[union-attr]
    assert d.inflight("m") == 0


async def test_saturated_bursts_with_reason(world: World) -> None:
    world.replica = stats(kv=0.91)
    cloud = FakeProvider()
    done = await run(dispatcher(world, cloud=cloud), "chat", CHAT, "r-2", deadline_s=5)
    assert (done.route, done.target) == ("cloud", "cloud:sim")
    assert done.reason == "kv_usage 0.91 >= 0.85 on all 1 replicas"
    assert cloud.calls == ["r-2"]


async def test_local_only_waits_for_room(world: World) -> None:
    world.replica = stats(kv=0.91)
    world.changes = {3: stats(kv=0.5)}
    observer, cloud = Observer(), FakeProvider()
    d = dispatcher(world, cloud=cloud, observer=observer)
    done = await run(d, "chat", CHAT, "r-3", deadline_s=5, x_spillover_residency="local_only")
    assert done.route == "local" and cloud.calls == []
    assert done.waited_s == pytest.approx(0.3)
    assert observer.max_waiting == 1 and observer.outcomes == ["local"]
    assert observer.decisions == 4 and observer.records == ["r-3"]  # first plan + 3 re-plans while waiting
    record = d.decisions.get("r-3")
    assert record is not None  # built from the plan that ran, not the one made before the wait
    assert (record.route, record.chosen, record.replans) == ("local", "local:m", 3)
    assert record.waited_s == pytest.approx(0.3) and record.reason.startswith("local capacity")


async def test_local_only_times_out_with_429(world: World) -> None:
    world.replica = stats(kv=0.91)
    cloud = FakeProvider()
    with pytest.raises(LocalCapacityExhausted) as caught:
        await run(
            dispatcher(world, cloud=cloud), "chat", CHAT, "r-4", deadline_s=1.0, x_spillover_residency="local_only"
        )
    assert caught.value.status_code == 429 and caught.value.retry_after_s >= 1
    assert "local_only" in caught.value.message and "no local room after 1.0s" in caught.value.message
    assert cloud.calls == []


async def test_a_wait_that_times_out_is_recorded_as_such(world: World) -> None:
    world.replica = stats(kv=0.91)
    d = dispatcher(world)
    with pytest.raises(LocalCapacityExhausted):
        await run(d, "chat", CHAT, "r-4b", deadline_s=1.0, x_spillover_residency="local_only")
    record = d.decisions.get("r-4b")
    assert record is not None and (record.route, record.chosen, record.attempts) == ("wait", None, ())
    assert "no local room after 1.0s" in record.reason


async def test_full_waiting_room_rejects_at_once(world: World) -> None:
    world.replica = stats(kv=0.91)
    config = parse_config({**make_config().model_dump(mode="json"), "admission": {"queue_max": 0}}, "t")
    with pytest.raises(LocalCapacityExhausted, match="waiting room full"):
        await run(dispatcher(world, config), "chat", CHAT, "r-5", deadline_s=5, x_spillover_residency="local_only")
    assert world.sleeps == 0


async def test_configured_admission_limit_bursts_extra_requests(world: World) -> None:
    d = dispatcher(world, make_config(admission_limit=1))
    held = await run(d, "chat", {**CHAT, "stream": True}, "r-6", deadline_s=5)
    second = await run(d, "chat", CHAT, "r-7", deadline_s=5)
    assert (held.route, second.route) == ("local", "cloud")
    assert second.reason == "inflight 1 >= admission limit 1"
    _ = [c async for c in held.reply.chunks]  # type: ignore[union-attr]
    third = await run(d, "chat", CHAT, "r-8", deadline_s=5)
    assert third.route == "local"


def test_computed_admission_limit_from_engine_blocks(world: World) -> None:
    d = dispatcher(world)
    # 364 blocks x 128 = 46,592 tokens; 512 + 256 tokens per sequence -> 60 sequences; 80% -> 48.
    assert d.admission.limit("m", world.snapshot(), world.now) == 48
    world.replica = stats(read_at=T0 - 10)
    stale = ClusterSnapshot(taken_at=T0, replicas=(world.replica,), max_age_s=1.0)
    assert d.admission.limit("m", stale, T0) is None


async def test_local_failure_before_first_byte_falls_back_to_cloud(world: World) -> None:
    local, cloud = FakeEngine(), FakeProvider()
    local.fail = TargetUnavailable("replica died")
    done = await run(dispatcher(world, local=local, cloud=cloud), "chat", CHAT, "r-9", deadline_s=5)
    assert done.route == "cloud" and "failed before the first byte: replica died" in done.reason
    local_only = dispatcher(world, local=local, cloud=cloud)
    with pytest.raises(TargetUnavailable):
        await run(local_only, "chat", CHAT, "r-10", deadline_s=5, x_spillover_residency="local_only")
    assert cloud.calls == ["r-9"] and local_only.inflight("m") == 0


async def test_completions_never_burst(world: World) -> None:
    world.replica = stats(kv=0.91)
    with pytest.raises(LocalCapacityExhausted, match="no cloud provider serves m"):
        await run(dispatcher(world), "completions", {"prompt": "x"}, "r-11", deadline_s=0.3)


class HangingLocal(FakeEngine):
    """A local call that never gets its first byte (a dead replica's request held by Serve)."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = False

    async def call(self, alias: str, kind: Kind, body: dict[str, Any], request_id: str) -> BackendReply:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError("unreachable")


EPOCH = 1.7e9  # the wall clock's reading when the monotonic one reads 0: stats are read at wall-clock times


async def test_waiting_for_first_byte_fails_over_when_model_goes_stale(world: World) -> None:
    """On real clocks: the stats' ages on the wall clock, the request's deadline on the monotonic one (a wall
    reading compared with a monotonic deadline would never let the call be abandoned)."""
    calls = {"n": 0}

    def snapshot() -> ClusterSnapshot:
        calls["n"] += 1
        wall = EPOCH + world.now
        read_at = wall if calls["n"] == 1 else wall - 5  # fresh at decision time, stale after
        return ClusterSnapshot(taken_at=wall, replicas=(replace(world.replica, read_at=read_at),), max_age_s=1.0)

    local, cloud = HangingLocal(), FakeProvider()
    clocks = Clocks.of(world.clock, wall=lambda: EPOCH + world.now, sleep=world.sleep)
    d = Dispatcher(make_config(), local, {"sim": cloud}, snapshot, poll_s=0.01, clocks=clocks)
    done = await asyncio.wait_for(run(d, "chat", CHAT, "r-12", deadline_s=5), timeout=10)
    assert done.route == "cloud" and "went stale while waiting for the first byte" in done.reason
    assert local.cancelled and d.inflight("m") == 0 and cloud.calls == ["r-12"]


class SlowLocal(FakeEngine):
    """A local call whose first byte comes late but comes (an engine on a machine too busy to report its stats in
    time: its stats go stale while it works)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    async def call(self, alias: str, kind: Kind, body: dict[str, Any], request_id: str) -> BackendReply:
        await self.go.wait()
        return await super().call(alias, kind, body, request_id)


async def test_a_stale_model_is_waited_on_once_no_other_attempt_could_start(world: World) -> None:
    """Stats stale while the local call waits, but past the request's deadline: abandoning the call could only end
    in an error (no attempt may start after the deadline), so the call is waited on and answers."""
    local, cloud, calls = SlowLocal(), FakeProvider(), {"n": 0}

    def snapshot() -> ClusterSnapshot:
        calls["n"] += 1
        if calls["n"] == 2:
            world.now += 10  # past the 5 s deadline, the stats 5 s old
            asyncio.get_running_loop().call_later(0.1, local.go.set)  # the first byte, ten polls later
        read_at = world.now if calls["n"] == 1 else world.now - 5
        return ClusterSnapshot(taken_at=world.now, replicas=(replace(world.replica, read_at=read_at),), max_age_s=1.0)

    d = Dispatcher(
        make_config(), local, {"sim": cloud}, snapshot, poll_s=0.01, clocks=Clocks.of(world.clock, sleep=world.sleep)
    )
    done = await run(d, "chat", CHAT, "r-12b", deadline_s=5)
    assert done.route == "local" and cloud.calls == [] and d.inflight("m") == 0


async def test_a_replica_that_reports_a_fault_is_left_even_past_the_deadline(world: World) -> None:
    """Past the deadline stale stats are waited out (above), but a fault the replica reports itself (its engine
    stalled) is no slow machine: the call is abandoned and the client told at once, not after the request timeout."""
    local, cloud, calls = HangingLocal(), FakeProvider(), {"n": 0}

    def snapshot() -> ClusterSnapshot:
        calls["n"] += 1
        if calls["n"] == 2:
            world.now += 10  # past the 5 s deadline
        replica = world.replica if calls["n"] == 1 else replace(world.replica, fault="engine stalled for 40 s")
        return ClusterSnapshot(taken_at=world.now, replicas=(replace(replica, read_at=world.now),), max_age_s=1.0)

    d = Dispatcher(
        make_config(), local, {"sim": cloud}, snapshot, poll_s=0.01, clocks=Clocks.of(world.clock, sleep=world.sleep)
    )
    with pytest.raises(RequestError) as raised:
        await asyncio.wait_for(run(d, "chat", CHAT, "r-12c", deadline_s=5), timeout=10)
    assert "left routing while waiting for the first byte: engine stalled for 40 s" in raised.value.message
    assert local.cancelled and cloud.calls == []


@pytest.mark.parametrize(("fault", "ends"), [(None, "local"), ("engine stalled for 40 s", "error")])
async def test_on_its_last_attempt_a_call_is_left_for_a_fault_not_for_staleness(
    world: World, fault: str | None, ends: str
) -> None:
    """With one attempt allowed, stale stats are waited out (no attempt could follow), but a fault the replicas
    report still ends the request at once, as it did before the stale watch learnt about the attempt budget."""
    raw = make_config().model_dump(mode="json")
    raw["resilience"]["retry"]["max_attempts"] = 1
    local, cloud, calls = SlowLocal(), FakeProvider(), {"n": 0}

    def snapshot() -> ClusterSnapshot:
        calls["n"] += 1
        if calls["n"] == 3:
            asyncio.get_running_loop().call_later(0.1, local.go.set)  # the first byte, ten polls later
        if calls["n"] == 1:
            return world.snapshot()
        stale = replace(world.replica, read_at=world.now - 5, fault=None)
        stats = stale if fault is None else replace(world.replica, read_at=world.now, fault=fault)
        return ClusterSnapshot(taken_at=world.now, replicas=(stats,), max_age_s=1.0)

    clocks = Clocks.of(world.clock, sleep=world.sleep)
    d = Dispatcher(parse_config(raw, "t"), local, {"sim": cloud}, snapshot, poll_s=0.01, clocks=clocks)
    try:
        done = await asyncio.wait_for(run(d, "chat", CHAT, f"r-last-{ends}", deadline_s=5), timeout=10)
        outcome = done.route
    except RequestError as exc:
        outcome = "error"
        assert "left routing while waiting for the first byte" in exc.message
    assert outcome == ends and cloud.calls == []


async def test_a_fall_over_left_out_is_named_in_the_error(world: World) -> None:
    """The local call goes stale and, meanwhile, the cloud it would fall over to was shut (black: its key was
    refused by another request): the client's error names both, not the stale wait alone."""
    calls = {"n": 0}

    def snapshot() -> ClusterSnapshot:
        calls["n"] += 1
        if calls["n"] == 2:  # while the local call waits
            d.resilience.health.get("cloud:sim").credential_failed("provider_auth_failed")
        read_at = world.now if calls["n"] == 1 else world.now - 5
        return ClusterSnapshot(taken_at=world.now, replicas=(replace(world.replica, read_at=read_at),), max_age_s=1.0)

    local, cloud = HangingLocal(), FakeProvider()
    d = Dispatcher(
        make_config(), local, {"sim": cloud}, snapshot, poll_s=0.01, clocks=Clocks.of(world.clock, sleep=world.sleep)
    )
    with pytest.raises(TargetUnavailable) as raised:
        await run(d, "chat", CHAT, "r-13", deadline_s=5)
    message = raised.value.message
    assert "went stale while waiting for the first byte; then cloud:sim/" in message, message
    assert "skipped: cloud:sim is black" in message, message
    assert cloud.calls == []
