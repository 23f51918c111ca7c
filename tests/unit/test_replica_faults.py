"""What the gateway does with what a replica says of its own engine (router/routing/snapshot.py
`ReplicaStats.fault`: numerics failed, engine stalled) and with a greedy answer stuck in a loop
(serve_apps/streams/output_loops.py), through the real dispatcher over the fakes of tests/fakes.py."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

from router.errors import TargetUnavailable
from router.headers import DEGRADED
from router.routing.capabilities import local_id
from router.routing.snapshot import ClusterSnapshot
from serve_apps.backend import BackendReply
from serve_apps.dispatch.interfaces import LocalDispatch
from serve_apps.gateway_parts import OperatorParts
from tests.fakes import FakeEngine, FakeProvider, chunk_event
from tests.unit.test_dispatch import CHAT, World, dispatcher, make_config, run

NUMERICS = "numerics check failed: 3/8 prompts agree with the float32 reference on their first 8 greedy tokens"
LOOP = "L'Étoile, la Marseillaise, la femme, la femme, la femme, la femme,"


@pytest.fixture
def world() -> World:
    return World()


async def test_a_faulted_replica_is_left_at_once(world: World) -> None:
    world.replica = replace(world.replica, fault=NUMERICS)
    done = await run(dispatcher(world), "chat", CHAT, "r-1")
    assert done.route == "cloud"
    assert NUMERICS in done.reason  # the reason names the replica's fault


async def test_a_local_only_request_is_told_why(world: World) -> None:
    world.replica = replace(world.replica, fault=NUMERICS)
    with pytest.raises(TargetUnavailable) as caught:
        await run(dispatcher(world), "chat", {**CHAT, "model": "m"}, "r-1", x_spillover_residency="local_only")
    assert NUMERICS in caught.value.message


async def test_the_replica_comes_back_with_its_first_clean_reading(world: World) -> None:
    d = dispatcher(world)
    world.replica = replace(world.replica, fault="engine stalled: it held requests and took no step for 31s")
    assert (await run(d, "chat", CHAT, "r-1")).route == "cloud"
    world.replica = replace(world.replica, fault=None)
    assert (await run(d, "chat", CHAT, "r-2")).route == "local"  # no red cool-down on top of the fault


class HangingEngine(FakeEngine):
    """A local engine that never answers (a wedged one: the request waits for its first byte)."""

    async def call(self, alias: str, kind: Any, body: dict[str, Any], request_id: str) -> BackendReply:
        self.calls.append((alias, kind, body, request_id))
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class FaultingWorld(World):
    """The replica reports a stall from the fourth snapshot on, while a request waits for its first byte."""

    def __init__(self) -> None:
        super().__init__()
        self.polls = 0

    def snapshot(self) -> ClusterSnapshot:
        self.polls += 1
        if self.polls > 3:
            self.replica = replace(self.replica, fault="engine stalled: it held requests and took no step for 31s")
        return super().snapshot()


async def test_a_request_waiting_on_a_replica_that_faults_fails_over() -> None:
    world, cloud = FaultingWorld(), FakeProvider()
    d = dispatcher(world, local=HangingEngine(), cloud=cloud)
    done = await asyncio.wait_for(run(d, "chat", CHAT, "r-1"), 10)
    assert done.route == "cloud" and len(cloud.calls) == 1
    record = d.decisions.get("r-1")
    assert record is not None and record.attempts[0].error == "replica_fault"


async def test_a_greedy_loop_is_flagged_and_feeds_health(world: World) -> None:
    engine = FakeEngine(LOOP)
    engine.finish_reason = "length"
    d = dispatcher(world, local=engine)
    done = await run(d, "chat", {**CHAT, "temperature": 0, "max_tokens": 30}, "r-1")
    assert done.route == "local" and done.headers.get(DEGRADED) == "degenerate_output"
    assert done.reply.body is not None and done.reply.body["choices"][0]["message"]["content"] == LOOP
    record = d.decisions.get("r-1")
    assert record is not None and record.attempts[0].contract_errors[0].startswith("degenerate_output: ")
    health = d.resilience.health.get(local_id("m"))
    for i in range(2, 8):
        await run(d, "chat", {**CHAT, "temperature": 0, "max_tokens": 30}, f"r-{i}")
    assert health.state.value != "green"  # output failures in a row: health no longer green


async def test_sampled_or_finished_answers_are_not_flagged(world: World) -> None:
    engine = FakeEngine(LOOP)
    engine.finish_reason = "length"
    d = dispatcher(world, local=engine)
    done = await run(d, "chat", {**CHAT, "temperature": 0.8}, "r-1")
    assert DEGRADED not in done.headers
    engine.finish_reason = "stop"
    done = await run(d, "chat", {**CHAT, "temperature": 0}, "r-2")
    assert DEGRADED not in done.headers


async def test_models_whose_text_is_noise_are_not_checked(world: World) -> None:
    engine = FakeEngine(LOOP)
    engine.finish_reason = "length"
    d = dispatcher(world, make_config(degenerate_check=False), local=engine)
    done = await run(d, "chat", {**CHAT, "temperature": 0}, "r-1")
    assert DEGRADED not in done.headers


class LoopStreamEngine(FakeEngine):
    """A local engine streaming a greedy loop as vLLM does: content deltas, then a last chunk with
    `finish_reason: "length"`, then `[DONE]`."""

    async def call(self, alias: str, kind: Any, body: dict[str, Any], request_id: str) -> BackendReply:
        self.calls.append((alias, kind, body, request_id))

        async def chunks() -> Any:
            for word in LOOP.split(" "):
                yield chunk_event(alias, word + " ")
            last = {"object": "chat.completion.chunk", "model": alias,
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}  # fmt: skip
            yield f"data: {json.dumps(last)}\n\n"
            yield "data: [DONE]\n\n"

        return BackendReply(chunks=chunks())


async def test_a_streamed_greedy_loop_is_flagged_when_it_ends(world: World) -> None:
    d = dispatcher(world, local=LoopStreamEngine())
    done = await run(d, "chat", {**CHAT, "temperature": 0, "stream": True}, "r-1")
    assert done.reply.chunks is not None
    assert [c async for c in done.reply.chunks][-1] == "data: [DONE]\n\n"  # the client gets its answer
    record = d.decisions.get("r-1")
    assert record is not None and record.attempts[-1].outcome == "ok"
    assert record.attempts[-1].contract_errors[-1].startswith("degenerate_output: the answer ends in ")


async def test_readyz_names_the_replicas_fault_before_its_failed_health_check() -> None:
    """A faulted replica also fails Serve's health check, whose text through Ray says only
    "RayTaskError(RuntimeError)": /readyz gives the fault the replica reports instead."""
    import httpx

    from router.routing.snapshot import ReplicaStats
    from serve_apps.http.surface import GatewayHTTP, ServedModel

    now = 1_800_000_000.0
    faulted = ReplicaStats("m", "r1", "n1", now, 0.1, 0, 0, 0, 0, 364, 128, fault=NUMERICS)
    engine = FakeEngine()
    engine.unhealthy["m"] = "unhealthy: RayTaskError(RuntimeError)"
    http = GatewayHTTP(
        engine,
        [ServedModel("m", "llama", "cpu", 2048)],
        LocalDispatch(engine),
        created=0,
        operator=OperatorParts(
            snapshot=lambda: ClusterSnapshot(taken_at=now, replicas=(faulted,), max_age_s=1.0), clock=lambda: now
        ),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(http.app), base_url="http://gw") as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["models"]["m"] == NUMERICS
