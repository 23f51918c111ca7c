"""Provider answers as routing facts in the dispatcher: a 400 context_length_exceeded fails over to a
target with a larger window and is remembered for that request size; a 429's Retry-After is waited
out on the same target or not, by the scenario's strategy, the configured bound and the deadline.

Same world as test_dispatch_continuation.py: providers a < b < c by price, scenario `chat` (L3, cost),
`fast` (L3, latency), `default` (L2, quality). The fake clock advances by every sleep.
"""

from __future__ import annotations

from typing import Any

import pytest

from router.errors import ProviderContextExceeded, ProviderRateLimited, ProviderRejected
from router.request.contract import derive_contract
from router.resilience.retry import retry_after_choice, wait_out_delay
from tests.fakes import WordStreamProvider
from tests.unit.test_dispatch_continuation import ANSWER, World, make_config

ASK = {"messages": [{"role": "user", "content": "capital of France? " * 40}], "max_tokens": 64}


async def send(w: World, request_id: str, scenario: str = "chat", body: dict[str, Any] | None = None) -> Any:
    body = body or ASK
    contract = derive_contract({"model": "m", **body}, {"x-business-scenario": scenario}, w.config.policy)
    return await w.dispatcher.dispatch("chat", body, request_id, contract=contract, deadline_s=30)


def too_long() -> ProviderContextExceeded:
    return ProviderContextExceeded("cloud provider 'a' says the prompt does not fit its context window")


async def test_a_context_error_fails_over_and_is_remembered_for_that_size() -> None:
    w = World()
    w.providers["a"].script = [too_long()]
    done = await send(w, "r1")
    assert done.target == "cloud:b" and done.reply.body["choices"][0]["message"]["content"] == ANSWER
    assert [(a.target, a.outcome, a.error) for a in w.record("r1").attempts] == [
        ("cloud:a/m", "error", "context_length_exceeded"),
        ("cloud:b/m", "ok", None),
    ]
    assert w.sleeps == []  # no wait: another target at once

    done = await send(w, "r2")  # the same size again: a is not even tried
    assert done.target == "cloud:b" and len(w.providers["a"].calls) == 1
    (a,) = [c for c in w.record("r2").candidates if c.target == "cloud:a/m"]
    assert a.status == "unavailable" and "too long for its window" in (a.reason or "")

    small = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    assert (await send(w, "r3", body=small)).target == "cloud:a"  # smaller requests still go there


async def test_an_operator_reset_forgets_what_was_learnt_of_a_provider() -> None:
    w = World()
    w.providers["a"].script = [too_long()]
    await send(w, "r1")
    assert "window:cloud:a/m" not in w.dispatcher.resilience.reset("cloud:b")  # another provider: a's stays
    assert (await send(w, "r2")).target == "cloud:b"
    assert "window:cloud:a/m" in w.dispatcher.resilience.reset("cloud:a")
    assert (await send(w, "r3")).target == "cloud:a"


async def test_a_context_error_everywhere_returns_the_providers_400_never_truncated() -> None:
    w = World()
    for p in w.providers.values():
        p.script = [too_long()]
    with pytest.raises(ProviderContextExceeded) as caught:
        await send(w, "r1")
    assert caught.value.status_code == 400 and caught.value.code == "context_length_exceeded"
    assert [len(p.calls) for p in w.providers.values()] == [1, 1, 1]  # each tried once, none answered


async def test_other_400s_still_return_at_once() -> None:
    w = World()
    w.providers["a"].script = [ProviderRejected("cloud provider 'a' rejected the request (HTTP 400): bad field")]
    with pytest.raises(ProviderRejected):
        await send(w, "r1")
    assert w.providers["b"].calls == []


def rate_limited(seconds: float) -> ProviderRateLimited:
    return ProviderRateLimited("cloud provider 'a' is rate limiting (HTTP 429)", retry_after_s=seconds)


async def test_cost_waits_out_a_short_retry_after_on_the_same_target() -> None:
    w = World()
    w.providers["a"].script = [rate_limited(2)]
    done = await send(w, "r1", "chat")
    assert done.target == "cloud:a" and w.sleeps == [2]
    assert [a.outcome for a in w.record("r1").attempts] == ["error", "ok"]
    (event,) = w.record("r1").events
    assert event["kind"] == "retry_after" and event["wait"] is True and "strategy cost waits" in event["why"]


@pytest.mark.parametrize(
    ("scenario", "seconds", "retry", "why"),
    [
        ("fast", 2, {}, "strategy latency fails over at once"),
        ("default", 2, {}, "strategy quality fails over at once"),
        ("chat", 5, {}, "above the 2s bound"),
        ("chat", 2, {"retry_after_wait_max_s": 0}, "above the 0s bound"),
        ("chat", 30.5, {"retry_after_wait_max_s": 60}, "does not fit the deadline"),
    ],
)
async def test_otherwise_a_429_fails_over_at_once(
    scenario: str, seconds: float, retry: dict[str, Any], why: str
) -> None:
    w = World(make_config(retry=retry))
    w.providers["a"].script = [rate_limited(seconds)]
    done = await send(w, "r1", scenario)
    assert done.target == "cloud:b" and w.sleeps == []
    (event,) = w.record("r1").events
    assert event["wait"] is False and why in event["why"]


async def test_the_wait_lasts_until_the_domain_stops_cooling() -> None:
    """The domain's cool-down ends a few ms after the Retry-After (made here as a view of the same 429 merged
    through the breaker exchange would make it). Retrying when the Retry-After alone ends met "cooling after 429
    (retry in 0.0s)" and failed over, in a fresh-clone run of the integration tests."""
    w = World()
    provider = w.providers["a"]
    domain = w.resilience.breakers.domain(w.resilience.breakers.domain_of("cloud:a"))
    answer = provider.chat

    async def peer_view_then_answer(alias: str, body: dict[str, Any], request_id: str) -> Any:
        if not provider.script and not w.sleeps:
            domain.hold_open(w.now + 2.004, "cooling")  # a few ms past this replica's own 2 s
            provider.script = [rate_limited(2)]
        return await answer(alias, body, request_id)

    provider.chat = peer_view_then_answer  # type: ignore[method-assign]
    done = await send(w, "r1", "chat")
    assert done.target == "cloud:a" and w.sleeps == [pytest.approx(2.014)]
    assert [a.outcome for a in w.record("r1").attempts] == ["error", "ok"]


class EarlyTimers(World):
    """Its sleeps end 5 ms early on the breakers' clock, as uvloop's timers do against `time.monotonic` on a busy
    loop (uvloop reads its clock once per loop turn)."""

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += max(0.0, seconds - 0.005)


async def test_a_wait_that_ends_a_few_ms_early_sleeps_out_the_rest_of_the_cool_down() -> None:
    """An integration run (fresh clone, loaded machine) retried a Retry-After of 1 s into "cooling after 429
    (retry in 0.0s)" and failed over: the retry must wait for the cool-down the 429 started, not fail over."""
    w = EarlyTimers()
    w.providers["a"].script = [rate_limited(2)]
    done = await send(w, "r1", "chat")
    assert done.target == "cloud:a" and w.sleeps == [2, pytest.approx(0.015, abs=1e-4)]
    assert [a.outcome for a in w.record("r1").attempts] == ["error", "ok"]


async def test_a_cool_down_much_longer_than_the_wait_is_not_waited_for() -> None:
    w = World()
    w.providers["a"].script = [rate_limited(1)]
    domain = w.resilience.breakers.domain(w.resilience.breakers.domain_of("cloud:a"))
    original = w.resilience.failed

    def failed_and_cooled_for_longer(target: Any, exc: Any) -> Any:  # another 429 since: 30 s more
        rule = original(target, exc)
        domain.hold_open(w.now + 30, "cooling")
        return rule

    w.resilience.failed = failed_and_cooled_for_longer  # type: ignore[method-assign]
    done = await send(w, "r1", "chat")
    assert done.target == "cloud:b" and w.sleeps == [1]


def test_wait_out_delay_alone() -> None:
    assert wait_out_delay(2.0, 0.0) == 2.0  # nothing shut: the Retry-After
    assert wait_out_delay(2.0, 1.5) == 2.0  # it opens before the wait ends
    assert wait_out_delay(2.0, 2.004) == pytest.approx(2.014)  # a few ms later: until then, and a margin
    assert wait_out_delay(2.0, 30.0) == 2.0  # far later: not waited for (the retry is refused, it fails over)


async def test_the_wait_is_one_retry_then_it_fails_over() -> None:
    w = World()
    w.providers["a"].script = [rate_limited(1), rate_limited(1)]
    done = await send(w, "r1", "chat")
    assert done.target == "cloud:b" and w.sleeps == [1]
    assert [a.target for a in w.record("r1").attempts] == ["cloud:a/m", "cloud:a/m", "cloud:b/m"]


def test_the_retry_after_rule_alone() -> None:
    rule = {"max_wait_s": 2.0, "waiting_strategies": ("cost",), "now": 0.0, "deadline": 10.0}
    assert retry_after_choice(None, "cost", **rule) is None
    assert retry_after_choice(float("nan"), "cost", **rule) is None
    assert retry_after_choice(1.0, "cost", **rule).wait  # type: ignore[union-attr]
    assert not retry_after_choice(1.0, "latency", **rule).wait  # type: ignore[union-attr]
    assert not retry_after_choice(2.5, "cost", **rule).wait  # type: ignore[union-attr]
    assert not retry_after_choice(1.0, "cost", **{**rule, "now": 9.5}).wait  # type: ignore[union-attr]


def test_the_providers_in_these_tests_continue_prefills() -> None:
    assert WordStreamProvider("x", "a b").prefill
