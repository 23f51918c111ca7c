"""The dispatcher under faults: the retry table, backoff, budgets, breakers, health and quotas.

Two cloud providers serve model `m` (which has no tools locally, so tool requests go to the
cloud): `a` and `a2` share the failure domain `pool`, `b` is on its own. Time is a fake clock;
`sleep` advances it and records each backoff.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

import pytest

from cluster.config.deployment import SpilloverConfig, parse_config
from router.errors import (
    ProviderRateLimited,
    ProviderRejected,
    TargetUnavailable,
    UpstreamError,
)
from router.request.contract import derive_contract
from router.resilience.health import Health
from router.routing.policy import Policy
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.interfaces import Dispatched
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.limits.spend_ledger import SpendLedger
from serve_apps.resilience.state import Resilience
from tests.fakes import FakeEngine, FakeProvider
from tests.ledger_rows import spend_by_provider

T0 = 1_800_000_000.0
CAPS = {
    "snapshot": "m-2026-11",
    "context_window": 32768,
    "region": "us",
    "tools": True,
    "json_schema": True,
    "price_in_per_mtok": 1.0,
    "price_out_per_mtok": 2.0,
    "data_policy": "no_retention",
}
TOOLS = {
    "messages": [{"role": "user", "content": "weather?"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
}


def make_config(
    *, retry: dict[str, Any] | None = None, providers: dict[str, dict[str, Any]] | None = None
) -> SpilloverConfig:
    specs = providers or {"a": {"domain": "pool"}, "a2": {"domain": "pool"}, "b": {}}
    return parse_config(
        {
            "models": [
                {"alias": "m", "source": "prepared:x", "family": "llama", "engine_args": {"max_model_len": 4096}}
            ],
            "cloud": {
                "providers": [
                    {
                        "name": name,
                        "base_url": "http://127.0.0.1:1/v1",
                        "models": {"m": {"name": f"{name}-m", **CAPS}},
                        **extra,
                    }
                    for name, extra in specs.items()
                ]
            },
            "resilience": {
                "retry": {"max_attempts": 4, "backoff_base_s": 0.1, "backoff_cap_s": 1.0, **(retry or {})},
                "breaker": {"window_s": 30, "min_requests": 3, "failure_ratio": 0.5, "open_s": 10},
            },
        },
        "test",
    )


class World:
    def __init__(self) -> None:
        self.now = T0
        self.sleeps: list[float] = []
        self.replica = ReplicaStats("m", "r1", "n1", T0, 0.1, 0, 0, 0, 0, 364, 128)

    def clock(self) -> float:
        return self.now

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(taken_at=self.now, replicas=(self.replica,), max_age_s=1.0)

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


USAGE = {"prompt_tokens": 1000, "completion_tokens": 500}  # priced per attempt


@dataclass
class Setup:
    world: World
    providers: dict[str, FakeProvider]
    dispatcher: Dispatcher
    resilience: Resilience

    async def send(self, request_id: str, body: dict[str, Any] | None = None, **headers: str) -> Dispatched:
        body = body or TOOLS
        contract = derive_contract({"model": "m", **body}, headers, Policy())
        return await self.dispatcher.dispatch("chat", body, request_id, contract=contract, deadline_s=30)

    def record(self, request_id: str) -> Any:
        return self.dispatcher.decisions.get(request_id)


def setup(config: SpilloverConfig | None = None, spend: SpendLedger | None = None, world: World | None = None) -> Setup:
    config = config or make_config()
    world = world or World()
    providers = {p.name: FakeProvider(p.name, usage=USAGE) for p in config.cloud.providers}
    res = Resilience(config, clock=world.clock, rng=random.Random(7), spend=spend)
    local = FakeEngine()
    d = Dispatcher(
        config,
        local,
        providers,
        world.snapshot,
        clocks=Clocks.of(world.clock, sleep=world.sleep),
        parts=DispatchParts(resilience=res),
    )
    return Setup(world, providers, d, res)


def order(s: Setup) -> list[str]:
    """The providers in the order the pipeline ranks them for a tools request."""
    plan = s.dispatcher.plan(derive_contract({"model": "m", **TOOLS}, {}, Policy()), "chat")
    return [t.provider or "" for t in plan.cloud]


def outcomes(s: Setup, request_id: str) -> list[tuple[str, str]]:
    return [(a.target, a.outcome) for a in s.record(request_id).attempts]


def server_error() -> UpstreamError:
    return UpstreamError("HTTP 503", code="provider_error")


async def test_server_error_is_retried_once_on_the_same_target_after_a_jittered_backoff() -> None:
    s = setup()
    first = order(s)[0]
    s.providers[first].script = [server_error()]
    done = await s.send("r1")
    assert done.target == f"cloud:{first}"
    assert outcomes(s, "r1") == [(f"cloud:{first}/m", "error"), (f"cloud:{first}/m", "ok")]
    assert len(s.world.sleeps) == 1 and 0 <= s.world.sleeps[0] <= 0.1  # full jitter within base * 2^0


async def test_a_second_server_error_fails_over_to_the_next_candidate() -> None:
    s = setup()
    first, second = order(s)[:2]
    s.providers[first].script = [server_error(), server_error()]
    done = await s.send("r1")
    assert done.target == f"cloud:{second}"
    assert [o for _, o in outcomes(s, "r1")] == ["error", "error", "ok"]
    assert "failed before the first byte" in done.reason


async def test_a_timeout_fails_over_without_waiting_on_the_same_target() -> None:
    s = setup()
    first, second = order(s)[:2]
    s.providers[first].script = [TargetUnavailable("no answer in 1 s", code="provider_timeout")]
    done = await s.send("r1")
    assert done.target == f"cloud:{second}" and s.world.sleeps == []
    assert len(s.providers[first].calls) == 1


async def test_a_client_error_returns_at_once_and_is_never_sent_elsewhere() -> None:
    s = setup()
    first = order(s)[0]
    s.providers[first].script = [ProviderRejected("bad tool schema", status_code=422)]
    with pytest.raises(ProviderRejected):
        await s.send("r1")
    assert sum(len(p.calls) for p in s.providers.values()) == 1


async def test_a_429_cools_the_whole_domain_so_fallback_skips_its_other_models() -> None:
    s = setup()
    assert order(s)[0] in ("a", "a2")  # the pool ranks first (same caps; a tie broken by order)
    first = order(s)[0]
    s.providers[first].script = [ProviderRateLimited("slow down", retry_after_s=7)]
    done = await s.send("r1")
    assert done.target == "cloud:b", "the other model of the same domain must be skipped"
    assert s.providers["a2" if first == "a" else "a"].calls == []
    # while the domain cools, both pool targets are out of the plan, and the record says why
    assert order(s) == ["b"]
    await s.send("r2")
    reasons = {c.target: c.reason for c in s.record("r2").candidates if c.status == "unavailable"}
    assert set(reasons) == {"cloud:a/m", "cloud:a2/m"} and all("cooling" in r for r in reasons.values())
    s.world.now += 7.1
    assert set(order(s)) == {"a", "a2", "b"}


async def test_the_breaker_opens_after_repeated_failures_and_the_plan_leaves_the_target_out() -> None:
    s = setup(make_config(providers={"a": {}, "b": {}}))
    first = order(s)[0]
    for i in range(3):
        s.providers[first].script = [TargetUnavailable("down", code="provider_unreachable")] * 2
        assert (await s.send(f"r{i}")).target != f"cloud:{first}"
    calls = len(s.providers[first].calls)
    await s.send("after")
    assert len(s.providers[first].calls) == calls, "an open breaker must keep requests away"
    assert s.resilience.breakers.states()[f"target:cloud:{first}/m"] == "open"
    s.providers[first].script = []  # the target has recovered
    s.world.now += 10.1  # half-open: one trial goes through and closes it
    await s.send("trial")
    assert s.record("trial").attempts[0].target == f"cloud:{first}/m"
    assert s.resilience.breakers.states()[f"target:cloud:{first}/m"] == "closed"


async def test_same_domain_retries_need_the_retry_budget_but_failing_over_does_not() -> None:
    s = setup(make_config(retry={"budget_ratio": 0.0, "budget_min_per_s": 0.0}, providers={"a": {}, "b": {}}))
    first, second = order(s)
    s.providers[first].script = [server_error()]
    done = await s.send("r1")
    assert done.target == f"cloud:{second}", "no budget for a same-target retry; failing over is free"
    assert s.world.sleeps == []


async def test_max_attempts_bounds_the_chain() -> None:
    s = setup(make_config(retry={"max_attempts": 2}, providers={"a": {}, "b": {}}))
    first, second = order(s)
    s.providers[first].script = [server_error(), server_error()]
    with pytest.raises(UpstreamError):
        await s.send("r1")
    assert s.providers[second].calls == []
    assert len(s.record("r1").attempts) == 2


async def test_a_refused_key_turns_the_provider_black_and_traffic_moves_away() -> None:
    s = setup(make_config(providers={"a": {}, "b": {}}))
    first, second = order(s)
    s.providers[first].script = [UpstreamError("refused our credentials (HTTP 401)", code="provider_auth_failed")]
    assert (await s.send("r1")).target == f"cloud:{second}"
    assert s.resilience.health.get(f"cloud:{first}").state is Health.BLACK
    await s.send("r2")
    assert len(s.providers[first].calls) == 1
    assert s.record("r2").health[f"cloud:{first}"] == "black"
    assert s.resilience.reset(f"cloud:{first}")  # the operator fixed the key
    assert order(s)[0] == first


async def test_a_stream_cut_after_the_first_token_is_not_resent_and_counts_against_the_target() -> None:
    s = setup(make_config(providers={"a": {}, "b": {}}))
    first, second = order(s)
    s.providers[first].cut = True
    done = await s.send("r1", {**TOOLS, "stream": True})
    chunks = []
    with pytest.raises(UpstreamError):
        async for chunk in done.reply.chunks:  # type: ignore[union-attr]
            chunks.append(chunk)
    assert len(chunks) == 1 and s.providers[second].calls == []
    assert s.resilience.breakers.target(f"cloud:{first}/m")._window  # the failure was recorded


async def test_a_provider_quota_sends_the_overflow_elsewhere() -> None:
    s = setup(make_config(providers={"a": {"rpm": 1}, "b": {"rpm": 1000}}))
    first = order(s)[0]
    if first != "a":
        pytest.skip("ranking put b first; the quota under test is a's")
    await s.send("r1")
    done = await s.send("r2")
    assert done.target == "cloud:b"
    skipped = [a for a in s.record("r2").attempts if a.outcome == "skipped"]
    assert skipped and "1/1 requests" in (skipped[0].error or "")
    assert done.reason.startswith("cloud:a skipped: ")  # the header says why it did not run there


async def test_local_only_with_the_local_model_down_is_503_not_a_wait() -> None:
    s = setup()
    s.world.replica = ReplicaStats("m", "r1", "n1", T0 - 5, 0.1, 0, 0, 0, 0, 364, 128)  # stale
    with pytest.raises(TargetUnavailable):
        await s.send("r1", {"messages": [{"role": "user", "content": "hi"}]}, **{"x-spillover-residency": "local_only"})
    assert s.resilience.health.get("local:m").state is Health.GREEN  # unavailable while stale, not (yet) red
    s.world.now += 55  # no push since: stale for a minute, 55 s of it watched by this gateway
    with pytest.raises(TargetUnavailable):
        await s.send("r2", {"messages": [{"role": "user", "content": "hi"}]}, **{"x-spillover-residency": "local_only"})
    assert s.resilience.health.get("local:m").state is Health.RED


class LatePush(World):
    """The replica's reading is 1.5 s old (one push half a second past `max_age_s`) until the gateway
    first waits; the next push has arrived by then."""

    def snapshot(self) -> ClusterSnapshot:
        read_at = self.now if self.sleeps else self.now - 1.5
        return ClusterSnapshot(taken_at=self.now, replicas=(replace(self.replica, read_at=read_at),), max_age_s=1.0)


async def test_local_only_after_one_late_push_waits_for_the_next_reading() -> None:
    """Readiness said ready a moment earlier: a request that may not leave is not refused for one late
    push (stale counts as saturated, so it waits in the admission queue) and is served locally."""
    s = setup(world=LatePush())
    done = await s.send(
        "r1", {"messages": [{"role": "user", "content": "hi"}]}, **{"x-spillover-residency": "local_only"}
    )
    assert done.route == "local" and done.waited_s > 0 and s.world.sleeps
    assert s.resilience.health.get("local:m").state is Health.GREEN


async def test_every_cloud_attempt_is_charged_to_the_ledger_failed_ones_included(tmp_path: Any) -> None:
    ledger = SpendLedger(tmp_path / "spend.sqlite", clock=lambda: T0)
    s = setup(make_config(providers={"a": {}, "b": {}}), spend=ledger)
    first = order(s)[0]
    s.providers[first].script = [server_error()]
    await s.send("r1")
    assert ledger.month_total(T0) == pytest.approx((1000 * 1.0 + 500 * 2.0) / 1e6)
    rows = spend_by_provider(ledger, since=T0 - 1)
    assert set(rows) == {first}


async def test_a_half_open_provider_takes_a_few_trials_and_a_successful_one_starts_its_ramp() -> None:
    s = setup()
    first, second = order(s)[:2]
    machine = s.resilience.health.get(f"cloud:{first}")
    machine.mark_down("down for a while")
    cooling = [await s.send(f"cool{i}") for i in range(20)]
    assert {d.target for d in cooling} == {f"cloud:{second}"}  # red in its cool-down: out of the plan
    s.world.now += 10.0  # the default 10 s cool-down is over
    assert machine.half_open
    targets = []
    while not machine.ramping:
        targets.append((await s.send(f"trial{len(targets)}")).target)
        assert len(targets) < 100, "no trial in 100 requests at a 10% share"
    assert targets[-1] == f"cloud:{first}" and set(targets[:-1]) <= {f"cloud:{second}"}
    assert (machine.state, machine.share()) == (Health.YELLOW, 0.2)
    assert machine.reason == "a live request succeeded while half-open: ramp to 20%"
    if len(targets) > 1:  # a request the share kept off it says why in its decision record
        assert "is red, half-open, and takes 10% of new requests" in (s.record("trial0").attempts[0].error or "")
