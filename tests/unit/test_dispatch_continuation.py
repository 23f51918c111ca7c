"""Streams that finish: a text stream cut mid-answer continued on the next target that accepts a
prefill, spliced into the same response (serve_apps/streams/continuation.py), and when it may not be.

Three providers serve model `m`, ranked a < b < c by price (the local model's window is too small
for these requests, so they go to the cloud). Providers stream word by word and continue a prefill
like vLLM's chat API (tests/fakes.py WordStreamProvider). Scenario `chat` is L3 (continues streams by
default), `default` L2 (does not).
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from cluster.config.deployment import SpilloverConfig, parse_config
from router.errors import RequestError
from router.request.contract import derive_contract
from router.routing.snapshot import ClusterSnapshot
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.interfaces import NoObserver
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.limits.spend_ledger import SpendLedger
from serve_apps.resilience.state import Resilience
from tests.fakes import FakeEngine, WordStreamProvider
from tests.ledger_rows import spend_by_provider

T0 = 1_800_000_000.0
ANSWER = "The capital of France is Paris and it is lovely"
BODY = {"messages": [{"role": "user", "content": "capital of France?"}], "stream": True, "max_tokens": 64}
SCENARIOS = {
    "default": {"level": "L2"},
    "chat": {"level": "L3", "strategy": "cost"},
    "fast": {"level": "L3", "strategy": "latency"},
    "quiet": {"level": "L3", "continue_streams": False},
}


def caps(price: float, **extra: Any) -> dict[str, Any]:
    return {
        "snapshot": "m-1",
        "context_window": 32768,
        "region": "us",
        "tools": True,
        "json_schema": True,
        "prefill": True,
        "price_in_per_mtok": price,
        "price_out_per_mtok": price,
        **extra,
    }


def make_config(
    prices: dict[str, dict[str, Any]] | None = None, retry: dict[str, Any] | None = None
) -> SpilloverConfig:
    specs = prices or {"a": caps(1.0), "b": caps(2.0), "c": caps(3.0)}
    providers = [
        {"name": n, "base_url": "http://127.0.0.1:1/v1", "models": {"m": {"name": f"{n}-m", **c}}}
        for n, c in specs.items()
    ]
    raw = {
        "models": [{"alias": "m", "source": "prepared:x", "family": "llama", "engine_args": {"max_model_len": 16}}],
        "cloud": {"providers": providers},
        "policy": {"scenarios": SCENARIOS},
        "resilience": {"retry": {"max_attempts": 4, **(retry or {})}},
    }
    return parse_config(raw, "test")


class Repairs(NoObserver):
    def __init__(self) -> None:
        self.repairs: list[tuple[str, str]] = []

    def stream_repaired(self, target: str, kind: str) -> None:
        self.repairs.append((target, kind))


class World:
    def __init__(
        self, config: SpilloverConfig | None = None, spend: SpendLedger | None = None, **providers: WordStreamProvider
    ) -> None:
        self.now = T0
        self.sleeps: list[float] = []
        self.config = config or make_config()
        self.providers = {
            p.name: providers.get(p.name) or WordStreamProvider(p.name, ANSWER) for p in self.config.cloud.providers
        }
        self.observer = Repairs()
        self.resilience = res = Resilience(self.config, clock=self.clock, rng=random.Random(1), spend=spend)
        self.dispatcher = Dispatcher(
            self.config,
            FakeEngine(),
            self.providers,
            lambda: ClusterSnapshot(self.now, (), 1.0),
            clocks=Clocks.of(self.clock, sleep=self.sleep),
            parts=DispatchParts(observer=self.observer, resilience=res),
        )

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def stream(self, request_id: str, scenario: str = "chat", body: dict[str, Any] | None = None) -> list[str]:
        body = body or BODY
        contract = derive_contract({"model": "m", **body}, {"x-business-scenario": scenario}, self.config.policy)
        done = await self.dispatcher.dispatch("chat", body, request_id, contract=contract, deadline_s=30)
        assert done.reply.chunks is not None
        return [event async for event in done.reply.chunks]

    def record(self, request_id: str) -> Any:
        return self.dispatcher.decisions.get(request_id)


def chunks(events: list[str]) -> list[dict[str, Any]]:
    return [json.loads(e.removeprefix("data: ")) for e in events if e != "data: [DONE]\n\n"]


def text(events: list[str]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks(events) if c["choices"])


async def test_a_cut_stream_is_continued_on_the_next_target_into_one_answer() -> None:
    w = World(a=WordStreamProvider("a", ANSWER, cut_after=4))
    events = await w.stream("r1")
    assert text(events) == ANSWER and events[-1] == "data: [DONE]\n\n"
    assert {c["id"] for c in chunks(events)} == {"a"}  # one completion: b's chunks carry a's id
    assert [c["choices"][0]["delta"].get("role") for c in chunks(events) if c["choices"]].count("assistant") == 1
    marker = chunks(events)[-1]
    assert marker["choices"] == [] and marker["spillover"] == {
        "continued": True,
        "from": "cloud:a/m",
        "to": "cloud:b/m",
        "splice_after_chars": len("The capital of France"),
        "splice_after_chunks": 4,
    }
    sent = w.providers["b"].bodies[-1]
    assert sent["messages"][-1] == {"role": "assistant", "content": "The capital of France"}
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert sent["max_tokens"] == 60  # 64 less the 4 tokens already streamed
    record = w.record("r1")
    assert [(a.target, a.outcome, a.error) for a in record.attempts] == [
        ("cloud:a/m", "cut", "provider_cut"),
        ("cloud:b/m", "ok", None),
    ]
    assert record.attempts[0].completion_tokens == 4 and record.attempts[1].completion_tokens == 6
    assert record.attempts[0].cost_usd and record.attempts[1].cost_usd  # both are paid for
    (continued,) = [e for e in record.events if e["kind"] == "continued"]
    assert continued["splice_after_chars"] == len("The capital of France") and continued["error"] == "provider_cut"
    assert "continued on cloud:b/m" in record.reason
    assert ("cloud:b/m", "continued") in w.observer.repairs


async def test_usage_asked_for_counts_both_attempts() -> None:
    w = World(a=WordStreamProvider("a", ANSWER, cut_after=4))
    body = {**BODY, "stream_options": {"include_usage": True}}
    events = await w.stream("r1", body=body)
    (usage,) = [c["usage"] for c in chunks(events) if c.get("usage")]
    prompt = w.record("r1").attempts[0].prompt_tokens
    assert usage["completion_tokens"] == 4 + 6 and usage["prompt_tokens"] == prompt + 10
    assert text(events) == ANSWER


async def test_a_fallback_that_refuses_the_prefill_is_passed_over() -> None:
    w = World(a=WordStreamProvider("a", ANSWER, cut_after=3), b=WordStreamProvider("b", ANSWER, prefill=False))
    events = await w.stream("r1")
    assert text(events) == ANSWER and chunks(events)[-1]["spillover"]["to"] == "cloud:c/m"
    outcomes = [(a.target, a.outcome) for a in w.record("r1").attempts]
    assert outcomes == [("cloud:a/m", "cut"), ("cloud:b/m", "error"), ("cloud:c/m", "ok")]


async def test_when_nobody_can_continue_the_stream_ends_with_the_first_error() -> None:
    config = make_config({"a": caps(1.0), "b": caps(2.0), "c": caps(3.0, prefill=False)})
    w = World(config, a=WordStreamProvider("a", ANSWER, cut_after=3), b=WordStreamProvider("b", ANSWER, prefill=False))
    received: list[str] = []
    with pytest.raises(RequestError) as caught:
        received += await w.stream("r1")
    assert caught.value.code == "provider_cut"  # the gateway turns it into its clean error event
    assert w.providers["c"].bodies == []  # declared without prefill: never asked
    (event,) = [e for e in w.record("r1").events if e["kind"] == "not_continued"]
    assert "cloud:c/m: accepts no prefill" in event["why"] and "cloud:b/m: provider_rejected" in event["why"]
    assert ("cloud:a/m", "not_continued") in w.observer.repairs


@pytest.mark.parametrize(
    ("scenario", "body", "why"),
    [
        ("quiet", BODY, "does not continue streams"),
        ("chat", {**BODY, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tool"),
        ("chat", {**BODY, "response_format": {"type": "json_object"}}, "JSON"),
    ],
)
async def test_continuation_is_off_where_the_rule_says(scenario: str, body: dict[str, Any], why: str) -> None:
    w = World(a=WordStreamProvider("a", ANSWER, cut_after=3))
    with pytest.raises(RequestError):
        await w.stream("r1", scenario, body)
    assert w.providers["b"].bodies == [] and w.providers["c"].bodies == []  # never re-sent anywhere
    (event,) = [e for e in w.record("r1").events if e["kind"] == "not_continued"]
    assert why in event["why"]


async def test_the_default_l2_scenario_continues_a_broken_stream() -> None:
    """L2 lets a flagged answer through: a continued stream is flagged by its last chunk (docs/resilience.md)."""
    w = World(a=WordStreamProvider("a", ANSWER, cut_after=3))
    events = await w.stream("r1", "default", BODY)
    assert text(events) == ANSWER
    assert [e["kind"] for e in w.record("r1").events] == ["continued"]


async def test_a_header_that_makes_the_request_l1_turns_continuation_off() -> None:
    w = World(a=WordStreamProvider("a", ANSWER, cut_after=3))
    contract = derive_contract(
        {"model": "m", **BODY}, {"x-business-scenario": "chat", "x-spillover-level": "L1"}, w.config.policy
    )
    assert contract.level == "L1"
    assert not w.config.policy.scenarios["chat"].continues_streams(contract.level)


async def test_a_continuation_that_breaks_too_is_continued_by_the_next_one() -> None:
    w = World(a=WordStreamProvider("a", ANSWER, cut_after=2), b=WordStreamProvider("b", ANSWER, cut_after=3))
    events = await w.stream("r1")
    assert text(events) == ANSWER
    assert (
        chunks(events)[-1]["spillover"]["from"] == "cloud:a/m" and chunks(events)[-1]["spillover"]["to"] == "cloud:c/m"
    )
    assert w.providers["c"].bodies[-1]["messages"][-1]["content"] == "The capital of France is"
    assert [a.outcome for a in w.record("r1").attempts] == ["cut", "error", "ok"]


async def test_a_stream_that_finishes_is_left_alone() -> None:
    w = World()
    events = await w.stream("r1")
    assert text(events) == ANSWER and not any("spillover" in c for c in chunks(events))
    assert w.record("r1").events == () and w.providers["b"].bodies == []


async def test_both_parts_are_charged_to_the_spend_ledger(tmp_path: Any) -> None:
    ledger = SpendLedger(tmp_path / "spend.sqlite", clock=lambda: T0)
    w = World(spend=ledger, a=WordStreamProvider("a", ANSWER, cut_after=4))
    await w.stream("r1")
    by_provider = spend_by_provider(ledger, since=T0 - 1)
    record = w.record("r1")
    assert by_provider["a"] == pytest.approx(record.attempts[0].cost_usd)
    assert by_provider["b"] == pytest.approx(record.attempts[1].cost_usd)
