"""Sessions through the real dispatcher (serve_apps/dispatch/dispatcher.py + serve_apps/sessions/turns.py) over the
shared fakes: pinning, the switch rules, the anchor on a switch, compression to a smaller window, the record and
the metrics. The local engine's pressure comes from the snapshot (tests/unit/test_dispatch.py's World,
a fake clock); the provider records the bodies it receives, as cloud-sim's request log does."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.config.deployment import SpilloverConfig, parse_config
from router.errors import LocalCapacityExhausted, NoTargetFitsContext, TargetUnavailable, UpstreamError
from router.request.contract import derive_contract
from router.sessions.anchor import ANCHOR_INTRO
from router.sessions.compress import SUMMARY_INTRO
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.interfaces import Dispatched
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.sessions.pins import PinClient, PinTable, local_pins
from serve_apps.sessions.turns import Sessions
from serve_apps.telemetry.metrics import GatewayMetrics
from tests.fakes import FakeEngine, FakeProvider
from tests.unit.test_dispatch import SIM_M, World, stats

SYSTEM = {"role": "system", "content": "You plan trips."}
SCENARIOS = {"default": {}, "pinned": {"switch": "never"}, "roaming": {"switch": "free"}}


def make_config(window: int = 32768, local_len: int = 4096) -> SpilloverConfig:
    return parse_config(
        {
            "admission": {"queue_max": 2, "queue_timeout_s": 5},
            "models": [
                {"alias": "m", "source": "prepared:x", "family": "llama", "engine_args": {"max_model_len": local_len}}
            ],
            "cloud": {
                "providers": [
                    {
                        "name": "sim",
                        "base_url": "http://127.0.0.1:1/v1",
                        "models": {"m": {**SIM_M, "context_window": window}},
                    }
                ]
            },
            "policy": {"scenarios": SCENARIOS},
            "sessions": {"compress": {"keep_last": 3, "summary_tokens": 64}},
        },
        "test",
    )


class Parts:
    def __init__(self, world: World, config: SpilloverConfig | None = None, table: PinTable | None = None) -> None:
        self.config = config or make_config()
        self.local = FakeEngine(answer='{"intent": "book", "status": "found 3 flights", "noise": 1}')
        self.cloud = FakeProvider(answer="cloud answer")
        self.metrics = GatewayMetrics()
        pins = PinClient(*local_pins(table), cache_s=0.0) if table is not None else None
        self.d = Dispatcher(
            self.config,
            self.local,
            {"sim": self.cloud},
            world.snapshot,
            poll_s=0.1,
            clocks=Clocks.of(world.clock, sleep=world.sleep),
            parts=DispatchParts(observer=self.metrics, sessions=Sessions(self.config, self.local, pins)),
        )
        self.history: list[dict[str, Any]] = [SYSTEM]

    async def turn(self, text: str, rid: str, session: str = "s1", **headers: str) -> Dispatched:
        self.history.append({"role": "user", "content": text})
        body = {"model": "m", "messages": list(self.history), "max_tokens": 32}
        hdrs = {"x-spillover-session": session, **{k.replace("_", "-"): v for k, v in headers.items()}}
        contract = derive_contract(body, hdrs, self.config.policy)
        done = await self.d.dispatch("chat", body, rid, contract=contract, deadline_s=2)
        self.history.append({"role": "assistant", "content": "answer"})
        return done

    def session(self, rid: str) -> dict[str, Any]:
        record = self.d.decisions.get(rid)
        assert record is not None and record.session is not None
        return dict(record.session)

    def switches(self, to: str, why: str) -> float:
        labels = {"model": "m", "from": "local:m" if to != "local:m" else "cloud:sim/m", "to": to, "why": why}
        return self.metrics.registry.get_sample_value("spillover_session_switches_total", labels) or 0.0


@pytest.fixture
def world() -> World:
    return World()


async def test_a_session_stays_local_while_it_has_room(world: World) -> None:
    p = Parts(world)
    for i in range(6):
        world.replica = stats(kv=0.1 + 0.1 * i)  # rising load, below the 0.85 watermark
        done = await p.turn(f"Plan step {i} for Lisbon", f"r{i}")
        assert done.target == "local:m"
    assert p.session("r0")["action"] == "new" and p.session("r5")["action"] == "keep"
    assert p.session("r5")["stored"] == {"target": "local:m", "turns": 6, "switches": 0}
    assert "session kept on local:m" in done.reason
    assert not p.cloud.bodies


async def test_a_saturated_local_model_forces_one_switch_that_carries_the_anchor(world: World) -> None:
    p = Parts(world)
    await p.turn("Book Paris to Berlin for 2 people", "r1")
    world.replica = stats(kv=0.95)
    done = await p.turn("Now the hotel", "r2")
    assert done.target == "cloud:sim" and done.reason.startswith("session switched local:m -> cloud:sim/m (capacity")
    assert p.session("r2")["switch"] == {"from": "local:m", "to": "cloud:sim/m", "why": "capacity"}
    (sent,) = p.cloud.bodies
    assert sent["messages"][0] == SYSTEM and sent["messages"][1]["content"].startswith(ANCHOR_INTRO)
    anchor = sent["messages"][1]["content"]
    assert "Book Paris to Berlin" in anchor and '"intent":"book"' in anchor and "noise" not in anchor
    assert p.switches("cloud:sim/m", "capacity") == 1
    # on_failure: the session stays on the cloud target once local has room again, without a new anchor
    world.replica = stats(kv=0.1)
    again = await p.turn("And a car", "r3")
    assert again.target == "cloud:sim" and p.session("r3")["action"] == "keep"
    assert not p.cloud.bodies[1]["messages"][1]["content"].startswith(ANCHOR_INTRO)
    assert p.switches("cloud:sim/m", "capacity") == 1


async def test_switch_free_follows_every_plan(world: World) -> None:
    p = Parts(world)
    world.replica = stats(kv=0.95)
    assert (await p.turn("hi", "r1", x_business_scenario="roaming")).target == "cloud:sim"
    world.replica = stats(kv=0.1)
    assert (await p.turn("again", "r2", x_business_scenario="roaming")).target == "local:m"
    assert p.session("r2")["switch"]["why"] == "free" and p.switches("local:m", "free") == 1


async def test_switch_never_waits_for_the_pinned_model_then_429s(world: World) -> None:
    p = Parts(world)
    await p.turn("hi", "r1", x_business_scenario="pinned")
    world.replica = stats(kv=0.95)
    with pytest.raises(LocalCapacityExhausted):
        await p.turn("again", "r2", x_business_scenario="pinned")
    assert not p.cloud.bodies
    assert p.session("r2")["action"] == "keep"


async def test_a_failed_pinned_provider_moves_the_session_by_fail_over(world: World) -> None:
    p = Parts(world)
    world.replica = stats(kv=0.95)
    await p.turn("Book Rome", "r1")
    world.replica = stats(kv=0.1)
    p.cloud.script = [UpstreamError("HTTP 503", code="provider_error")] * 2
    done = await p.turn("Then Naples", "r2")
    assert done.target == "local:m"
    switch = p.session("r2")["switch"]
    assert switch == {"from": "cloud:sim/m", "to": "local:m", "why": "failure"}
    assert p.local.calls[-1][2]["messages"][1]["content"].startswith(ANCHOR_INTRO)  # the anchor went local


def _long_turn(i: int) -> str:
    return f"Turn {i} about Lisbon: " + "details of the itinerary " * 40  # ~250 tokens


async def test_a_switch_to_a_smaller_window_compresses_the_history_with_the_summariser(world: World) -> None:
    p = Parts(world, make_config(window=900))
    for i in range(5):
        await p.turn(_long_turn(i), f"r{i}")  # ~1,300 estimated tokens by now: fits local's 4,096, not 900
    world.replica = stats(kv=0.95)
    done = await p.turn("Summarise the plan", "r5")
    assert done.target == "cloud:sim"
    (sent,) = p.cloud.bodies
    contents = [m["content"] for m in sent["messages"]]
    assert sent["messages"][0] == SYSTEM and contents[1].startswith(ANCHOR_INTRO)
    assert contents[2].startswith(SUMMARY_INTRO) and sent["messages"][-3:] == p.history[-4:-1]
    summary_call = p.local.calls[-1]
    assert summary_call[3] == "r5-summary" and summary_call[2]["max_tokens"] == 64
    session = p.session("r5")
    (prepared,) = session["prepared"]
    assert prepared["anchor"] is True and prepared["compression"]["summary_by"] == "model:m"
    assert prepared["compression"]["tokens_after"] <= 900 - 32 < prepared["compression"]["tokens_before"]
    assert session["planned_compressed"] is True
    saved = p.metrics.registry.get_sample_value("spillover_session_tokens_saved_total", {"model": "m"})
    assert saved == prepared["compression"]["tokens_saved"] > 0
    # local has room again: the session stays on the smaller window, compressed again (no anchor: not a switch)
    world.replica = stats(kv=0.1)
    again = await p.turn("And the hotels?", "r6")
    assert again.target == "cloud:sim" and p.session("r6")["action"] == "keep"
    contents = [m["content"] for m in p.cloud.bodies[1]["messages"]]
    assert contents[1].startswith(SUMMARY_INTRO) and not any(c.startswith(ANCHOR_INTRO) for c in contents)


async def test_a_summariser_that_fails_leaves_an_extractive_summary(world: World) -> None:
    p = Parts(world, make_config(window=900))
    for i in range(5):
        await p.turn(_long_turn(i), f"r{i}")
    world.replica = stats(kv=0.95)
    p.local.fail = UpstreamError("engine gone", code="upstream_error")
    done = await p.turn("Summarise the plan", "r5")
    assert done.target == "cloud:sim"
    assert p.session("r5")["prepared"][0]["compression"]["summary_by"] == "extractive"
    assert "Turn 3 about Lisbon" in p.cloud.bodies[0]["messages"][2]["content"]


async def test_what_compression_cannot_fit_is_still_a_400(world: World) -> None:
    p = Parts(world, make_config(window=200, local_len=600))
    for i in range(2):
        await p.turn("short", f"r{i}")
    p.history.append({"role": "user", "content": "word " * 3000})
    body = {"model": "m", "messages": p.history, "max_tokens": 32}
    contract = derive_contract(body, {"x-spillover-session": "s1"}, p.config.policy)
    with pytest.raises(NoTargetFitsContext):
        await p.d.dispatch("chat", body, "r9", contract=contract, deadline_s=2)


async def test_two_dispatchers_over_one_table_agree_on_the_pin(world: World) -> None:
    table = PinTable(world.clock, ttl_s=600, max_sessions=100)
    busy, quiet = World(), world
    busy.replica = stats(kv=0.95)
    a, b = Parts(busy, table=table), Parts(quiet, table=table)
    assert (await a.turn("first", "r1")).target == "cloud:sim"
    b.history = list(a.history)
    done = await b.turn("second", "r2")  # local has room on b's side: the pin keeps it on the cloud
    assert done.target == "cloud:sim" and b.session("r2")["action"] == "keep"
    assert b.session("r2")["stored"]["turns"] == 2


async def test_sessions_are_per_tenant(world: World) -> None:
    table = PinTable(world.clock, ttl_s=600, max_sessions=100)
    busy = World()
    busy.replica = stats(kv=0.95)
    a, b = Parts(busy, table=table), Parts(world, table=table)
    await a.turn("first", "r1")  # no tenant: pinned to the cloud
    b.history.append({"role": "user", "content": "mine"})
    body = {"model": "m", "messages": b.history, "max_tokens": 8}
    contract = derive_contract(body, {"x-spillover-session": "s1"}, b.config.policy)
    from dataclasses import replace

    done = await b.d.dispatch("chat", body, "r2", contract=replace(contract, tenant="other"), deadline_s=2)
    assert done.target == "local:m" and b.session("r2")["action"] == "new"


async def test_requests_without_a_session_are_routed_as_before(world: World) -> None:
    p = Parts(world)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    contract = derive_contract(body, {}, p.config.policy)
    done = await p.d.dispatch("chat", body, "r1", contract=contract, deadline_s=2)
    record = p.d.decisions.get("r1")
    assert done.target == "local:m" and record is not None and record.session is None
    assert "session" not in done.reason


async def test_an_open_breaker_on_the_pinned_provider_is_a_breaker_switch(world: World) -> None:
    p = Parts(world)
    world.replica = stats(kv=0.95)
    await p.turn("Book Oslo", "r1")
    world.replica = stats(kv=0.1)
    p.d.resilience.breakers.target("cloud:sim/m").hold_open(world.now + 3600, "failures")
    done = await p.turn("Then Bergen", "r2")
    assert done.target == "local:m" and len(p.cloud.bodies) == 1
    assert p.session("r2")["switch"] == {"from": "cloud:sim/m", "to": "local:m", "why": "breaker"}


async def test_switch_never_refuses_when_the_pinned_provider_is_unavailable(world: World) -> None:
    p = Parts(world)
    world.replica = stats(kv=0.95)
    await p.turn("Book Oslo", "r1", x_business_scenario="pinned")
    world.replica = stats(kv=0.1)
    p.d.resilience.breakers.target("cloud:sim/m").hold_open(world.now + 3600, "failures")
    with pytest.raises(TargetUnavailable, match="switch: never"):
        await p.turn("Then Bergen", "r2", x_business_scenario="pinned")
    assert len(p.cloud.bodies) == 1 and len(p.local.calls) == 0


async def test_streams_and_completions_are_pinned_too(world: World) -> None:
    p = Parts(world)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    contract = derive_contract(body, {"x-spillover-session": "s1"}, p.config.policy)
    done = await p.d.dispatch("chat", body, "r1", contract=contract, deadline_s=2)
    assert done.reply.chunks is not None and [c async for c in done.reply.chunks][-1] == "data: [DONE]\n\n"
    prompt = {"model": "m", "prompt": "Once upon a time", "metadata": {"session_id": "s1"}}
    contract = derive_contract(prompt, {}, p.config.policy)
    await p.d.dispatch("completions", prompt, "r2", contract=contract, deadline_s=2)
    assert p.session("r2")["action"] == "keep" and p.session("r2")["stored"]["turns"] == 2
    # nothing added to a completions prompt (and `metadata` is not one of the fields the engine is sent)
    assert p.local.calls[-1][2] == {k: v for k, v in prompt.items() if k != "metadata"}
