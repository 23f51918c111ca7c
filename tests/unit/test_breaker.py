"""Circuit breakers per target and per failure domain: table-driven, fake clock, pure."""

from __future__ import annotations

import json

import pytest

from router.resilience.breaker import Breakers, BreakerSettings, CircuitBreaker
from tests.fakes import FakeClock

SETTINGS = BreakerSettings()  # window 30s, min 5, ratio 0.5, open 10s, 1 half-open probe


def feed(breaker: CircuitBreaker, clock: FakeClock, outcomes: list[tuple[float, bool]]) -> None:
    for dt, ok in outcomes:
        clock.advance(dt)
        breaker.record(ok)


@pytest.mark.parametrize(
    ("outcomes", "state"),
    [
        pytest.param([(1, False)] * 4, "closed", id="4-failures-below-min-count"),
        pytest.param([(1, False)] * 5, "open", id="5-failures-reach-min-count"),
        pytest.param([(1, False)] * 3 + [(1, True)] * 2, "open", id="ratio-0.6-trips"),
        pytest.param([(1, True)] * 3 + [(1, False)] * 2, "closed", id="ratio-0.4-holds"),
        pytest.param([(1, True)] * 5 + [(1, False)] * 5, "open", id="ratio-exactly-0.5-trips"),
        pytest.param([(1, True)] * 20, "closed", id="all-good"),
        pytest.param([(0, False)] * 4 + [(30, False)], "closed", id="failures-30s-old-slide-out"),
        pytest.param([(0, False)] * 4 + [(29.9, False)], "open", id="failures-29.9s-old-still-count"),
    ],
)
def test_closed_breaker_trips_on_ratio_and_min_count(outcomes: list[tuple[float, bool]], state: str) -> None:
    clock = FakeClock(1_700_000_000.0)
    breaker = CircuitBreaker(SETTINGS, clock)
    feed(breaker, clock, outcomes)
    assert breaker.state == state
    assert breaker.allow() is (state == "closed")


@pytest.mark.parametrize(
    ("after", "state", "retry_in"),
    [(0.0, "open", 10.0), (4.0, "open", 6.0), (9.9, "open", 0.1), (10.0, "half_open", None), (60.0, "half_open", None)],
)
def test_open_turns_half_open_lazily(after: float, state: str, retry_in: float | None) -> None:
    clock = FakeClock(1_700_000_000.0)
    breaker = CircuitBreaker(SETTINGS, clock)
    feed(breaker, clock, [(0, False)] * 5)
    opened_at = clock.now
    clock.advance(after)
    assert breaker.state == state
    assert breaker.retry_in_s() == (None if retry_in is None else pytest.approx(retry_in))
    assert breaker.open_until() == (opened_at + 10.0 if state == "open" else None)


@pytest.mark.parametrize("probes", [1, 2, 3])
def test_half_open_lets_through_at_most_the_probe_limit(probes: int) -> None:
    clock = FakeClock(1_700_000_000.0)
    breaker = CircuitBreaker(BreakerSettings(half_open_probes=probes), clock)
    breaker.cool(5.0)
    clock.advance(5.0)
    assert [breaker.allow() for _ in range(probes + 2)] == [True] * probes + [False, False]


@pytest.mark.parametrize(
    ("trial_ok", "state", "allows_after"),
    [(True, "closed", True), (False, "open", False)],
)
def test_half_open_trial_outcome(trial_ok: bool, state: str, allows_after: bool) -> None:
    clock = FakeClock(1_700_000_000.0)
    breaker = CircuitBreaker(SETTINGS, clock)
    feed(breaker, clock, [(0, False)] * 5)
    clock.advance(10.0)
    assert breaker.allow()
    breaker.record(trial_ok)
    assert breaker.state == state
    assert breaker.allow() is allows_after
    if not trial_ok:
        assert breaker.open_until() == pytest.approx(clock.now + 10.0)


def test_closing_clears_the_window() -> None:
    clock = FakeClock(1_700_000_000.0)
    breaker = CircuitBreaker(SETTINGS, clock)
    feed(breaker, clock, [(0, True)] * 4 + [(0, False)] * 5)
    clock.advance(10.0)
    breaker.allow()
    breaker.record(True)
    feed(breaker, clock, [(0, False)] * 4)  # without the clear, the pre-open outcomes would make this 8/12 failed
    assert breaker.state == "closed"
    breaker.record(False)
    assert breaker.state == "open"


def test_late_result_while_open_is_ignored() -> None:
    clock = FakeClock(1_700_000_000.0)
    breaker = CircuitBreaker(SETTINGS, clock)
    feed(breaker, clock, [(0, False)] * 5)
    until = breaker.open_until()
    clock.advance(3.0)
    breaker.record(True)  # a request admitted before the trip, answering late
    breaker.record(False)
    assert breaker.state == "open"
    assert breaker.open_until() == until


def test_lost_trial_frees_its_slot_after_probe_timeout() -> None:
    clock = FakeClock(1_700_000_000.0)
    breaker = CircuitBreaker(BreakerSettings(probe_timeout_s=60.0), clock)
    breaker.cool(1.0)
    clock.advance(1.0)
    assert breaker.allow()
    clock.advance(59.0)
    assert not breaker.allow()
    clock.advance(1.0)
    assert breaker.allow()


@pytest.mark.parametrize(
    ("first", "second", "open_for"),
    [
        pytest.param(3.0, None, 3.0, id="cool-once"),
        pytest.param(3.0, 8.0, 8.0, id="longer-cool-extends"),
        pytest.param(8.0, 3.0, 8.0, id="shorter-cool-never-shortens"),
        pytest.param(0.0, None, 0.0, id="retry-after-zero-is-half-open-at-once"),
        pytest.param(-5.0, None, 0.0, id="negative-clamped"),
    ],
)
def test_cool_forces_open_then_half_open(first: float, second: float | None, open_for: float) -> None:
    clock = FakeClock(1_700_000_000.0)
    breaker = CircuitBreaker(SETTINGS, clock)
    breaker.cool(first)
    if second is not None:
        breaker.cool(second)
    assert breaker.cause == "cooling"
    if open_for > 0:
        assert breaker.state == "open"
        assert breaker.retry_in_s() == pytest.approx(open_for)
        clock.advance(open_for - 0.01)
        assert breaker.state == "open"
    clock.advance(0.01)
    assert breaker.state == "half_open"
    assert breaker.allow()


@pytest.mark.parametrize(
    "bad",
    [
        {"window_s": 0},
        {"min_requests": 0},
        {"failure_ratio": 0.0},
        {"failure_ratio": 1.5},
        {"half_open_probes": 0},
        {"open_s": -1},
    ],
)
def test_settings_reject_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BreakerSettings(**bad)  # type: ignore[arg-type]


# -- the board ------------------------------------------------------------------------------------


def test_429_cools_the_whole_domain_but_not_other_domains() -> None:
    clock = FakeClock(1_700_000_000.0)
    board = Breakers(SETTINGS, clock)
    board.cool_domain("sim", 3.0)
    gpt = board.allows("cloud:sim/gpt", "sim")
    glm = board.allows("cloud:sim/glm", "sim")
    other = board.allows("cloud:official/deepseek", "official")
    assert gpt == (False, "domain sim cooling after 429 (retry in 3.0s)")
    assert glm == (False, "domain sim cooling after 429 (retry in 3.0s)")
    assert other == (True, "")
    assert board.states()["domain:sim"] == "open"
    assert board.states()["domain:official"] == "closed"
    assert board.states()["target:cloud:sim/gpt"] == "closed"  # the target itself is fine


def test_target_breaker_refuses_with_retry_time() -> None:
    clock = FakeClock(1_700_000_000.0)
    board = Breakers(SETTINGS, clock)
    for _ in range(5):
        board.record("cloud:sim/gpt", "sim", ok=False)
    clock.advance(5.8)
    assert board.allows("cloud:sim/gpt", "sim") == (False, "breaker open for cloud:sim/gpt (retry in 4.2s)")
    assert board.allows("cloud:sim/glm", "sim") == (True, "")  # one broken model does not close the endpoint


@pytest.mark.parametrize(
    ("failing_targets", "domain_state"),
    [
        pytest.param(["a"], "closed", id="one-target-failing-is-not-a-group-fact"),
        pytest.param(["a", "b"], "open", id="failures-across-two-targets-open-the-domain"),
    ],
)
def test_domain_trips_only_on_failures_from_several_targets(failing_targets: list[str], domain_state: str) -> None:
    clock = FakeClock(1_700_000_000.0)
    board = Breakers(SETTINGS, clock)
    for i in range(6):
        board.record(failing_targets[i % len(failing_targets)], "sim", ok=False)
    assert board.states()["domain:sim"] == domain_state
    ok, reason = board.allows("c", "sim")
    assert ok is (domain_state == "closed")
    if not ok:
        assert reason == "breaker open for domain sim (retry in 10.0s)"


def test_a_sources_failures_sliding_out_no_longer_count_toward_the_domain() -> None:
    # failures are counted per source as the window moves (not recounted per outcome): once target a's
    # failures are 30 s old, a's and b's together must not reach the two sources the domain needs
    clock = FakeClock(1_700_000_000.0)
    board = Breakers(SETTINGS, clock)
    for _ in range(3):
        board.record("a", "sim", ok=False)
    clock.advance(30)
    for _ in range(3):
        board.record("b", "sim", ok=False)
    assert board.states()["domain:sim"] == "closed"
    board.record("a", "sim", ok=False)  # a fails again inside the window: two sources, 5 of 5 failed
    board.record("a", "sim", ok=False)
    assert board.states()["domain:sim"] == "open"


def test_half_open_domain_admits_one_trial_across_its_targets() -> None:
    clock = FakeClock(1_700_000_000.0)
    board = Breakers(SETTINGS, clock)
    board.cool_domain("sim", 2.0)
    clock.advance(2.0)
    assert board.allows("cloud:sim/gpt", "sim") == (True, "half-open trial for domain sim")
    assert board.allows("cloud:sim/glm", "sim") == (False, "breaker half-open for domain sim (trial request in flight)")
    board.record("cloud:sim/gpt", "sim", ok=True)
    assert board.states()["domain:sim"] == "closed"
    assert board.allows("cloud:sim/glm", "sim") == (True, "")


def test_refused_target_does_not_spend_the_domains_trial() -> None:
    clock = FakeClock(1_700_000_000.0)
    board = Breakers(SETTINGS, clock)
    for _ in range(5):
        board.record("a", "sim", ok=False)  # target a open for 10s
    board.cool_domain("sim", 1.0)
    clock.advance(1.0)  # domain half-open, target a still open
    assert board.allows("a", "sim")[0] is False
    assert board.allows("b", "sim") == (True, "half-open trial for domain sim")


def test_export_merge_between_two_replicas() -> None:
    clock = FakeClock(1_700_000_000.0)
    here, there = Breakers(SETTINGS, clock), Breakers(SETTINGS, clock)
    here.cool_domain("sim", 30.0)
    for _ in range(5):
        here.record("local:qwen", "local:qwen", ok=False)
    wire = json.loads(json.dumps(here.export()))  # must survive plain JSON
    assert set(wire["open"]) == {"domain:sim", "target:local:qwen"}

    assert there.merge(wire) == 2
    assert there.allows("cloud:sim/gpt", "sim") == (False, "domain sim cooling after 429 (retry in 30.0s)")
    assert there.allows("local:qwen", "local:qwen") == (False, "breaker open for local:qwen (retry in 10.0s)")
    assert there.merge(wire) == 0  # idempotent: nothing later than what is held


@pytest.mark.parametrize(
    ("local_s", "remote_s", "kept_s", "changed"),
    [
        pytest.param(5.0, 20.0, 20.0, 1, id="remote-later-wins"),
        pytest.param(20.0, 5.0, 20.0, 0, id="local-later-kept"),
        pytest.param(None, 7.0, 7.0, 1, id="closed-here-opens"),
    ],
)
def test_merge_keeps_the_later_open_until(local_s: float | None, remote_s: float, kept_s: float, changed: int) -> None:
    clock = FakeClock(1_700_000_000.0)
    here, there = Breakers(SETTINGS, clock), Breakers(SETTINGS, clock)
    if local_s is not None:
        there.cool_domain("sim", local_s)
    here.cool_domain("sim", remote_s)
    assert there.merge(here.export()) == changed
    assert there.domain("sim").retry_in_s() == pytest.approx(kept_s)


def test_merge_ignores_expired_entries_and_export_omits_closed() -> None:
    clock = FakeClock(1_700_000_000.0)
    board = Breakers(SETTINGS, clock)
    stale = {"version": 1, "open": {"domain:sim": {"until": clock.now - 1.0, "cause": "cooling"}}}
    assert board.merge(stale) == 0
    assert board.states()["domain:sim"] == "closed"
    assert board.export() == {"version": 1, "open": {}}


@pytest.mark.parametrize(
    "bad",
    [
        {"version": 2, "open": {}},
        {"open": {}},
        {"version": 1, "open": []},
        {"version": 1, "open": {"replica:x": {"until": 1.0}}},
        {"version": 1, "open": {"domain:sim": {"until": "soon"}}},
        {"version": 1, "open": {"domain:sim": {"until": 1.0, "cause": "vibes"}}},
    ],
)
def test_merge_rejects_malformed_exports(bad: dict) -> None:
    board = Breakers(SETTINGS, FakeClock(1_700_000_000.0))
    with pytest.raises(ValueError, match="breaker export"):
        board.merge(bad)


def test_reset_forgets_the_breakers_of_one_provider_or_of_all() -> None:
    clock = FakeClock(1_700_000_000.0)
    board = Breakers(BreakerSettings(min_requests=1, failure_ratio=0.5), clock)
    for target, domain in (("cloud:sim/m", "sim"), ("cloud:other/m", "other")):
        board.record(target, domain, ok=False)
    board.cool_domain("sim", 30)
    assert not board.allows("cloud:sim/m", "sim")[0]
    assert sorted(board.reset("cloud:sim")) == ["domain:sim", "target:cloud:sim/m"]
    assert board.allows("cloud:sim/m", "sim")[0]
    assert not board.allows("cloud:other/m", "other")[0]
    # (allows() created sim's breakers again, closed)
    assert sorted(board.reset()) == ["domain:other", "domain:sim", "target:cloud:other/m", "target:cloud:sim/m"]
    assert board.states() == {}


def test_reset_of_a_provider_forgets_its_configured_domain_and_leaves_the_others() -> None:
    """p and q share the failure domain `acct` (cloud.providers[].domain); r is its own domain."""
    clock = FakeClock(1_700_000_000.0)
    board = Breakers(SETTINGS, clock, failure_domains={"p": "acct", "q": "acct", "r": "r"})
    board.cool_domain("acct", 30)
    board.cool_domain("r", 30)
    board.cool_domain("p", 30)  # a domain merely named like the provider is not p's domain
    assert board.domain_of("cloud:p") == "acct" and board.domain_of("cloud:s") == "s"
    assert board.domain_of("local:qwen") == "local:qwen"
    assert sorted(board.reset("cloud:p")) == ["domain:acct"]
    assert board.allows("cloud:q/m", "acct")[0]  # the shared domain is closed for q too
    assert not board.allows("cloud:r/m", "r")[0]
    assert board.states()["domain:p"] == "open"
