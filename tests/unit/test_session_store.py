"""Server-side history (`sessions.store: true`) through the real dispatcher over the shared fakes: a client
sends only its new turn and the engine gets the stored ones in front of it, per tenant, bounded."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cluster.config.deployment import SpilloverConfig, parse_config
from router.request.contract import derive_contract
from router.sessions.carried import Label
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.sessions.history import HistoryClient, HistoryStore, Messages, Stored, local_history
from serve_apps.sessions.pins import PinClient, PinTable, local_pins
from serve_apps.sessions.turns import Sessions
from tests.fakes import FakeEngine, FakeProvider
from tests.unit.test_dispatch import World

SYSTEM = {"role": "system", "content": "be brief"}
LABEL = Label().to_json()  # a turn's context that may go anywhere (router/sessions/carried.py)


def make_config(**sessions: Any) -> SpilloverConfig:
    model = {"alias": "m", "source": "prepared:x", "family": "llama", "engine_args": {"max_model_len": 4096}}
    return parse_config({"models": [model], "sessions": {"store": True, **sessions}}, "test")


def dispatcher(config: SpilloverConfig, engine: FakeEngine, history: HistoryClient | None = None) -> Dispatcher:
    world = World()
    sessions = Sessions(config, engine, history=history)
    return Dispatcher(
        config,
        engine,
        {"sim": FakeProvider()},
        world.snapshot,
        clocks=Clocks.of(world.clock),
        parts=DispatchParts(sessions=sessions),
    )


async def send(d: Dispatcher, config: SpilloverConfig, text: str, rid: str, tenant: str | None = None) -> None:
    body = {"model": "m", "messages": [SYSTEM, {"role": "user", "content": text}]}
    contract = derive_contract(body, {"x-spillover-session": "s1"}, config.policy)
    await d.dispatch("chat", body, rid, contract=replace(contract, tenant=tenant), deadline_s=2)


async def test_the_gateway_supplies_the_stored_turns_and_the_record_says_how_many() -> None:
    config, engine = make_config(), FakeEngine(answer="Lisbon")
    d = dispatcher(config, engine)
    await send(d, config, "Where should I go?", "r1")
    await send(d, config, "And in winter?", "r2")
    sent = engine.calls[-1][2]["messages"]
    assert sent == [
        SYSTEM,
        {"role": "user", "content": "Where should I go?"},
        {"role": "assistant", "content": "Lisbon"},
        {"role": "user", "content": "And in winter?"},
    ]
    record = d.decisions.get("r2")
    assert record is not None and record.session is not None
    assert record.session["history"]["supplied"] == 2 and record.session["history"]["dropped"] == 0
    assert record.contract["est_prompt_tokens"] > d.decisions.get("r1").contract["est_prompt_tokens"]  # type: ignore[union-attr]


async def test_history_beyond_the_budget_is_counted_not_sent() -> None:
    config, engine = make_config(history_tokens=40), FakeEngine(answer="ok " * 20)
    d = dispatcher(config, engine)
    for i in range(5):
        await send(d, config, f"turn {i}", f"r{i}")
    record = d.decisions.get("r4")
    assert record is not None and record.session is not None
    assert record.session["history"]["dropped"] > 0 and record.session["history"]["tokens"] <= 40


async def test_another_tenants_session_of_the_same_name_sees_nothing() -> None:
    config, engine = make_config(), FakeEngine()
    d = dispatcher(config, engine)
    await send(d, config, "secret plan", "r1", tenant="alpha")
    await send(d, config, "hello", "r2", tenant="beta")
    assert "secret plan" not in str(engine.calls[-1][2]["messages"])


async def test_a_store_that_does_not_answer_costs_the_history_not_the_turn() -> None:
    async def broken_get(key: str) -> Stored:
        raise ConnectionError("gone")

    async def broken_put(key: str, messages: Messages, label: Any) -> None:
        raise ConnectionError("gone")

    config, engine = make_config(), FakeEngine()
    d = dispatcher(config, engine, HistoryClient(broken_get, broken_put))
    await send(d, config, "hi", "r1")
    record = d.decisions.get("r1")
    assert record is not None and record.session is not None and record.session["history"] == {"store": "unavailable"}


def test_the_store_is_bounded_in_bytes_and_time() -> None:
    now = [0.0]
    store = HistoryStore(lambda: now[0], ttl_s=60, total_bytes=1000)
    for i in range(20):
        store.put(f"k{i}", [{"role": "user", "content": "x" * 100}], LABEL)
    assert store.bytes_kept <= 1000 and store.get("k0") == ([], None) and store.get("k19")[0] != []
    store.put("huge", [{"content": "y" * 5000}], LABEL)
    assert store.get("huge") == ([], None)  # larger than the whole store: not kept
    now[0] = 61
    assert store.get("k19") == ([], None)


async def test_local_history_round_trip() -> None:
    store = HistoryStore(total_bytes=10_000)
    client = HistoryClient(*local_history(store))
    assert await client.read("k") == ([], None) and await client.write("k", [{"role": "user", "content": "a"}], LABEL)
    assert await client.read("k") == ([{"role": "user", "content": "a"}], LABEL)


async def test_a_client_sending_the_whole_conversation_gets_no_second_copy_and_the_store_no_duplicates() -> None:
    config, engine = make_config(), FakeEngine(answer="Lisbon")
    d = dispatcher(config, engine)
    history: list[dict[str, Any]] = [SYSTEM]
    for i, text in enumerate(["Where should I go?", "And in winter?", "Hotels?"]):
        history.append({"role": "user", "content": text})
        body = {"model": "m", "messages": list(history)}
        contract = derive_contract(body, {"x-spillover-session": "s1"}, config.policy)
        await d.dispatch("chat", body, f"r{i}", contract=contract, deadline_s=2)
        assert engine.calls[-1][2]["messages"] == history  # exactly what the client sent
        history.append({"role": "assistant", "content": "Lisbon"})
    record = d.decisions.get("r2")
    assert record is not None and record.session is not None
    assert record.session["history"] == {"supplied": 0, "dropped": 0, "tokens": 0, "resent": 4}
    body = {"model": "m", "messages": [SYSTEM, {"role": "user", "content": "Thanks"}]}  # now only the new turn
    contract = derive_contract(body, {"x-spillover-session": "s1"}, config.policy)
    await d.dispatch("chat", body, "r3", contract=contract, deadline_s=2)
    assert engine.calls[-1][2]["messages"] == [*history, {"role": "user", "content": "Thanks"}]


async def test_two_replicas_over_one_pin_table_and_store_name_themselves_and_agree() -> None:
    """Each replica's Sessions over the same (here in-process) table and store, as the gateway wires the
    head node's actors: the second replica reads the pin and the history the first one wrote."""
    config, engine, table, store = make_config(), FakeEngine(answer="Lisbon"), PinTable(), HistoryStore()
    world = World()
    replicas = [
        Dispatcher(
            config,
            engine,
            {"sim": FakeProvider()},
            world.snapshot,
            clocks=Clocks.of(world.clock),
            parts=DispatchParts(
                sessions=Sessions(
                    config,
                    engine,
                    PinClient(*local_pins(table), cache_s=0.0),
                    HistoryClient(*local_history(store)),
                    replica=name,
                )
            ),
        )
        for name in ("replica-a", "replica-b")
    ]
    await send(replicas[0], config, "Where should I go?", "r1")
    await send(replicas[1], config, "And in winter?", "r2")
    first, second = replicas[0].decisions.get("r1"), replicas[1].decisions.get("r2")
    assert first is not None and first.session is not None and second is not None and second.session is not None
    assert (first.session["gateway_replica"], second.session["gateway_replica"]) == ("replica-a", "replica-b")
    assert second.session["pinned"] == first.session["target"] and second.session["stored"]["turns"] == 2
    assert second.session["history"]["supplied"] == 2
