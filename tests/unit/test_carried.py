"""The carried-state labels (router/sessions/carried.py), the per-tenant bound of the session stores
(router/sessions/tenant_lru.py) and how the stores and the summariser keep and use both."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cluster.config.deployment import parse_config
from cluster.config.session import CompressSection
from router.errors import NoCapableModel
from router.request.contract import RequestContract, derive_contract
from router.routing.capabilities import local_target
from router.sessions.carried import STRICTEST, Label, Origin, effective_label, from_json, label_of, restricted
from router.sessions.compress import plan_compression
from router.sessions.session_id import pin_key
from router.sessions.summary_cache import SummaryCache
from router.sessions.tenant_lru import TenantLru
from serve_apps.sessions.history import HistoryClient, HistoryStore
from serve_apps.sessions.pins import PinClient, PinTable
from serve_apps.sessions.summaries import Summariser
from serve_apps.sessions.turns import Sessions
from tests.fakes import FakeEngine
from tests.unit.test_filters import CLOUD

ONE, TWO = Origin("r1", "private", 1), Origin("r2", "eu", 2)
BASE = RequestContract(model="m", scenario="default", level="L2", strategy="quality", tenant="apps")


def _contract(**changes: Any) -> RequestContract:
    return replace(BASE, **changes)


def test_a_turns_label_holds_its_own_constraints_and_where_each_came_from() -> None:
    own = label_of(_contract(scenario="private", level="L1", residency="local_only"), ONE)
    assert (own.tenant, own.level, own.residency, own.providers, own.targets) == ("apps", "L1", "local_only", None, ())
    assert own.origin("residency") == ONE and own.restrictive
    assert not label_of(BASE, ONE).restrictive  # L2, anywhere: it keeps the context off nothing
    scoped = label_of(_contract(allowed_target_patterns=("local:*", "cloud:eu/*")), ONE)
    assert scoped.targets == (("cloud:eu/*", "local:*"),)


def test_a_join_is_the_strictest_of_both_and_keeps_the_turn_that_set_each() -> None:
    first = label_of(_contract(residency=frozenset({"eu", "us"}), allowed_providers=frozenset({"a", "b"})), ONE)
    second = label_of(_contract(level="L1", residency=frozenset({"eu"}), allowed_providers=frozenset({"b"})), TWO)
    joined = first.join(second)
    assert (joined.level, joined.residency, joined.providers) == ("L1", frozenset({"eu"}), frozenset({"b"}))
    assert joined.origin("level") == joined.origin("residency") == TWO
    assert first.join(label_of(BASE, TWO)) == first  # a looser turn changes nothing, origins included
    assert first.join(label_of(_contract(residency="local_only"), TWO)).residency == "local_only"
    # what a turn leaves: its own constraints joined with what it carried (a later turn never loosens it)
    later = effective_label(_contract(carried=joined), Origin("r3", "default", 3))
    assert later == joined


def test_a_label_round_trips_as_json_and_one_that_cannot_be_read_is_the_strictest() -> None:
    label = label_of(_contract(level="L1", residency=frozenset({"eu"}), allowed_target_patterns=("local:*",)), ONE)
    assert from_json(label.to_json(), "apps") == label
    for broken in [None, "x", 7, [], {"level": "L0"}, {"level": "L2", "residency": 5}, {"level": "L1", "tenant": 3}]:
        read = from_json(broken, "apps")
        assert (read.tenant, read.level, read.residency) == ("apps", STRICTEST.level, STRICTEST.residency)
    deep: dict[str, Any] = {"level": "L2", "residency": "any", "targets": [[{"a": 1}]]}
    assert from_json(deep, None).residency == "local_only"


def test_the_refusal_names_the_carried_turns_and_is_bounded() -> None:
    label = label_of(_contract(scenario="private", level="L1", residency="local_only"), ONE)
    reasons = [{"target": "local:m", "filter": "tools", "reason": "tools (function calling) not supported"}]
    reasons += [{"target": f"cloud:p{i}/m", "filter": "carried", "reason": "x" * 500} for i in range(50)]
    error = restricted(label, NoCapableModel("no target", reasons=reasons))
    assert error.code == "carried_context_restricted" and error.status_code == 422
    assert "residency local_only from turn 1 (request r1, scenario 'private')" in error.message
    assert "local:m: tools (function calling) not supported" in error.message and len(error.message) <= 1000
    assert "50 target(s) may not receive it" in error.message and error.reasons == reasons


def test_the_pin_table_and_the_store_only_ever_tighten_a_label() -> None:
    key = pin_key("apps", "m", "s1")
    private = label_of(_contract(residency="local_only"), ONE).to_json()
    loose = label_of(BASE, TWO).to_json()
    table = PinTable()
    table.record(key, None, "local:m", {"task": "t"}, private)
    # a replica that lost the compare-and-set, and a streamed answer's anchor: the label is joined all the same
    assert table.record(key, "cloud:x/m", "cloud:x/m", None, loose)["label"]["residency"] == "local_only"
    assert table.set_anchor(key, "local:m", {"task": "t2"}, loose)
    assert table.get(key)["label"]["residency"] == "local_only"  # type: ignore[index]
    store = HistoryStore()
    store.put(key, [{"role": "user", "content": "a"}], private)
    store.put(key, [{"role": "user", "content": "b"}], loose)
    assert store.get(key)[1]["residency"] == "local_only"  # type: ignore[index]


def test_tenant_lru_evicts_the_oldest_of_the_tenant_holding_the_most() -> None:
    lru: TenantLru[int] = TenantLru(6, lambda k: k[0])
    lru.put("b1", 1)
    for i in range(10):
        lru.put(f"a{i}", 1)
    assert lru.peek("b1") == 1 and len(lru) == 6 and lru.held("a") == 5 and lru.peek("a4") is None
    lru.get("a5")  # used: a tenant's own least recently used goes first
    lru.put("a10", 1)
    assert lru.peek("a5") is not None and lru.peek("a6") is None
    assert lru.clear() == 6 and len(lru) == 0 and lru.total == 0


def test_tenant_lru_in_bytes_lets_a_small_tenant_take_from_the_largest() -> None:
    lru: TenantLru[int] = TenantLru(6, lambda k: k[0], size=lambda v: v)
    lru.put("b1", 1)
    for i in range(4):
        lru.put(f"a{i}", 2)
    assert (lru.held("a"), lru.held("b"), lru.peek("a1")) == (4, 1, None)
    lru.put("b2", 2)  # b still holds less than a: a's oldest goes to make room
    assert (lru.held("a"), lru.held("b"), lru.peek("a2"), lru.peek("b1")) == (2, 3, None, 1)


def test_every_session_store_keeps_another_tenants_share() -> None:
    keys = [pin_key("apps", "m", f"s{i}") for i in range(50)]
    other = pin_key("other", "m", "s0")
    table = PinTable(max_sessions=10)
    table.record(other, None, "local:m", None, {})
    for key in keys:
        table.record(key, None, "local:m", None, {})
    assert table.get(other) is not None and table.held("apps") == 9 and table.get(keys[0]) is None
    summaries = SummaryCache(max_sessions=10)
    summaries.keep(other, "kept", "model:m", [], Label())
    for key in keys:
        summaries.keep(key, "s", "model:m", [], Label())
    assert summaries.find(other, []) is not None and summaries.held("apps") == 9
    store = HistoryStore(total_bytes=2_000)
    store.put(other, [{"content": "o" * 500}], {})
    for key in keys:
        store.put(key, [{"content": "a" * 500}], {})
    assert store.get(other)[0] != [] and store.held("other") > 500 and store.bytes_kept <= 2_000


async def test_a_kept_summary_is_reused_only_where_its_turns_may_go() -> None:
    """A summary kept under a local_only turn (this replica's cache outlives the pin, say) is not reused
    for a cloud target: the summariser writes one afresh from what this request carries."""
    engine = FakeEngine(answer="a fresh summary")
    summariser = Summariser(engine, CompressSection(summary_tokens=32))
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 40} for i in range(8)]
    plan = plan_compression(turns, 200, keep_last=2, summary_tokens=32)
    run = turns[plan.start : plan.end]
    key = pin_key("apps", "m", "s1")
    summariser.kept.keep(key, "the private summary", "model:m", run, label_of(_contract(residency="local_only"), ONE))
    local = local_target("m", {"max_model_len": 4096})
    assert (await summariser.summary(turns, plan, "r2", BASE, key, local, label_of(BASE, TWO)))[0] == (
        "the private summary"
    )
    assert engine.calls == []
    text, by, reused = await summariser.summary(turns, plan, "r2", BASE, key, CLOUD, label_of(BASE, TWO))
    assert (text, by, reused) == ("a fresh summary", "model:m", 0) and len(engine.calls) == 1


async def test_carried_state_without_a_label_counts_as_the_strictest() -> None:
    """A pin or stored turns that come without a label (written before labels, or damaged) never carry
    the context anywhere it could not have gone: the turn runs as if they were local_only and L1."""

    async def unlabelled_history(key: str) -> Any:
        return [{"role": "user", "content": "an old turn"}], None

    async def unlabelled_pin(key: str) -> Any:
        return {"target": "local:m", "turns": 1, "switches": 0, "anchor": {"task": "an old turn"}}

    async def nothing(*args: Any) -> Any:
        return None

    model = {"alias": "m", "source": "prepared:x", "family": "llama", "engine_args": {"max_model_len": 4096}}
    config = parse_config({"models": [model], "sessions": {"store": True}}, "test")
    body = {"model": "m", "messages": [{"role": "user", "content": "and now?"}]}
    contract = derive_contract(body, {"x-spillover-session": "s1"}, config.policy)
    for pins, history in (
        (None, HistoryClient(unlabelled_history, nothing)),
        (PinClient(unlabelled_pin, nothing, cache_s=0), None),
    ):
        turn = await Sessions(config, FakeEngine(), pins, history).open(contract, body, "r2")
        assert turn.contract.carried is not None and turn.contract.local_only and turn.contract.carried.level == "L1"
