"""Streams counted and checked through the real dispatcher (fakes of tests/fakes.py for the engine
and the providers, the real SQLite spend ledger, the real metrics): tokens, cost and the real
outcome reach the decision record, the decision log, the ledger and /metrics when the stream ends."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from router.errors import ContractViolation, UpstreamError
from router.learning.decision import DecisionRecord, DecisionStore
from router.request.contract import derive_contract
from router.routing.policy import Policy
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.interfaces import Dispatched
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.limits.spend_ledger import SpendLedger
from serve_apps.resilience.state import Resilience
from serve_apps.telemetry.metrics import GatewayMetrics
from tests.fakes import DONE, FakeEngine, FakeProvider, chunk_event
from tests.unit.test_dispatch_resilience import T0, TOOLS, USAGE, World, make_config

CHAT = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
PRICE_IN, PRICE_OUT = 1.0, 2.0  # per million tokens (test_dispatch_resilience.CAPS)
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL_BODY = {
    **TOOLS,
    "stream": True,
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
}


@dataclass
class Setup:
    world: World
    providers: dict[str, FakeProvider]
    local: FakeEngine
    dispatcher: Dispatcher
    log: list[str]
    metrics: GatewayMetrics
    ledger: SpendLedger

    async def send(self, request_id: str, body: dict[str, Any], **headers: str) -> Dispatched:
        contract = derive_contract({"model": "m", **body}, headers, Policy())
        return await self.dispatcher.dispatch("chat", body, request_id, contract=contract, deadline_s=30)

    def record(self, request_id: str) -> DecisionRecord:
        record = self.dispatcher.decisions.get(request_id)
        assert record is not None
        return record

    def ledger_rows(self) -> list[tuple[str, str, float]]:
        with sqlite3.connect(self.ledger.path) as db:
            return list(db.execute("SELECT request_id, outcome, cost_usd FROM spend ORDER BY id"))

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def setup(tmp_path: Path, providers: dict[str, dict[str, Any]] | None = None) -> Setup:
    config = make_config(providers=providers or {"a": {}})
    world = World()
    ledger = SpendLedger(tmp_path / "spend.sqlite", clock=lambda: T0)
    fakes = {p.name: FakeProvider(p.name, usage=USAGE) for p in config.cloud.providers}
    res = Resilience(config, clock=world.clock, rng=random.Random(7), spend=ledger)
    log: list[str] = []
    metrics = GatewayMetrics()
    local = FakeEngine(usage={"prompt_tokens": 30, "completion_tokens": 2})
    d = Dispatcher(
        config,
        local,
        fakes,
        world.snapshot,
        clocks=Clocks.of(world.clock, sleep=world.sleep),
        parts=DispatchParts(observer=metrics, decisions=DecisionStore(sink=log.append), resilience=res),
    )
    return Setup(world, fakes, local, d, log, metrics, ledger)


def saturated(s: Setup) -> None:
    s.world.replica = replace(s.world.replica, kv_cache_usage=0.95)


async def drain(done: Dispatched) -> list[str]:
    assert done.reply.chunks is not None
    return [text async for text in done.reply.chunks]


def records(log: list[str]) -> list[dict[str, Any]]:
    """The decision log's record lines (not the schema / snapshot blob lines before them)."""
    return [json.loads(line) for line in log if not line.startswith('{"kind"')]


def cost(prompt: int, completion: int) -> float:
    return (prompt * PRICE_IN + completion * PRICE_OUT) / 1e6


async def test_a_streamed_burst_is_booked_with_its_tokens_and_cost_when_it_ends(tmp_path: Path) -> None:
    s = setup(tmp_path)
    saturated(s)
    done = await s.send("r1", CHAT)
    assert done.route == "cloud"
    assert s.providers["a"].bodies[0]["stream_options"] == {"include_usage": True}  # asked upstream
    pending = s.record("r1").attempts[-1]
    assert (pending.outcome, pending.cost_usd, s.log) == ("streaming", None, [])  # not logged before its end
    s.world.now += 2.0
    sent = await drain(done)
    assert sent == [chunk_event("a/m", "ok"), DONE]  # the client did not ask for the usage chunk
    attempt = s.record("r1").attempts[-1]
    assert (attempt.outcome, attempt.prompt_tokens, attempt.completion_tokens) == ("ok", 1000, 500)
    assert attempt.usage == "reported" and attempt.cost_usd == pytest.approx(cost(1000, 500))
    assert attempt.latency_s == pytest.approx(2.0)  # to the end of the stream
    assert len(records(s.log)) == 1 and records(s.log)[0]["attempts"][-1]["outcome"] == "ok"
    assert s.record("r1").finished_at == T0 + 2.0
    s.ledger.flush()
    assert s.ledger_rows() == [("r1", "ok", pytest.approx(cost(1000, 500)))]
    assert s.metric("spillover_tokens_total", target="cloud:a/m", kind="completion") == 500
    assert s.metric("spillover_cost_usd_total", target="cloud:a/m") == pytest.approx(cost(1000, 500))
    assert s.metric("spillover_attempts_total", target="cloud:a/m", outcome="ok") == 1


async def test_the_usage_chunk_reaches_a_client_that_asked_for_it(tmp_path: Path) -> None:
    s = setup(tmp_path)
    saturated(s)
    done = await s.send("r1", {**CHAT, "stream_options": {"include_usage": True}})
    sent = await drain(done)
    assert json.loads(sent[1].removeprefix("data: "))["usage"] == USAGE and sent[-1] == DONE
    assert s.record("r1").attempts[-1].usage == "reported"


async def test_a_streamed_local_answer_is_counted_from_the_engine_usage_chunk(tmp_path: Path) -> None:
    s = setup(tmp_path)
    done = await s.send("r1", CHAT)
    assert done.route == "local" and s.local.calls[0][2]["stream_options"] == {"include_usage": True}
    sent = await drain(done)
    assert all('"usage"' not in text for text in sent)
    attempt = s.record("r1").attempts[-1]
    assert (attempt.outcome, attempt.prompt_tokens, attempt.completion_tokens, attempt.cost_usd) == ("ok", 30, 2, 0.0)
    assert s.metric("spillover_tokens_total", target="local:m", kind="prompt") == 30


async def test_a_stream_cut_by_the_provider_is_recorded_cut_with_what_it_consumed(tmp_path: Path) -> None:
    s = setup(tmp_path)
    saturated(s)
    s.providers["a"].cut = True
    done = await s.send("r1", CHAT)
    with pytest.raises(UpstreamError):
        await drain(done)
    record = s.record("r1")
    attempt = record.attempts[-1]
    estimate = derive_contract({"model": "m", **CHAT}, {}, Policy()).est_prompt_tokens
    assert (attempt.outcome, attempt.error, attempt.usage) == ("cut", "provider_cut", "counted")
    assert (attempt.prompt_tokens, attempt.completion_tokens) == (estimate, 1)
    assert attempt.cost_usd == pytest.approx(cost(estimate, 1)) and attempt.cost_usd > 0
    assert records(s.log)[0]["attempts"][-1]["outcome"] == "cut"
    s.ledger.flush()
    assert s.ledger_rows() == [("r1", "cut", pytest.approx(cost(estimate, 1)))]
    assert s.metric("spillover_attempts_total", target="cloud:a/m", outcome="cut") == 1


async def test_a_client_that_goes_away_leaves_a_cancelled_attempt_charged_what_it_consumed(tmp_path: Path) -> None:
    s = setup(tmp_path)
    saturated(s)
    s.providers["a"].stream_events = [chunk_event("a/m", f"t{i}") for i in range(50)]
    done = await s.send("r1", CHAT)
    assert done.reply.chunks is not None
    stream: AsyncIterator[str] = done.reply.chunks
    for _ in range(4):
        await stream.__anext__()
    await stream.aclose()  # type: ignore[attr-defined]
    attempt = s.record("r1").attempts[-1]
    assert (attempt.outcome, attempt.completion_tokens, attempt.usage) == ("cancelled", 4, "counted")
    assert attempt.cost_usd is not None and attempt.cost_usd > 0
    s.ledger.flush()
    assert [row[1] for row in s.ledger_rows()] == ["cancelled"]


def tool_events(arguments: str, *, content: str = "") -> list[str]:
    """A tool call streamed as OpenAI does: id and name first, then the arguments in pieces."""
    first = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    deltas: list[dict[str, Any]] = [{"content": content}] if content else []
    deltas += [{"role": "assistant", "tool_calls": [first]}]
    deltas += [
        {"tool_calls": [{"index": 0, "function": {"arguments": arguments[i : i + 4]}}]}
        for i in range(0, len(arguments), 4)
    ]
    events = [{"choices": [{"index": 0, "delta": d}]} for d in deltas]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return [f"data: {json.dumps(e)}\n\n" for e in events]


BAD_ARGS = json.dumps({"city": 7})
GOOD_ARGS = json.dumps({"city": "Paris"})


async def test_an_l2_streamed_tool_violation_is_flagged_in_the_record_and_metrics(tmp_path: Path) -> None:
    s = setup(tmp_path)
    s.providers["a"].stream_events = tool_events(BAD_ARGS)
    done = await s.send("r1", TOOL_BODY, **{"x-spillover-level": "L2"})
    sent = await drain(done)
    assert sent[-1] == DONE  # L2: the answer passes
    attempt = s.record("r1").attempts[-1]
    assert (attempt.outcome, attempt.contract) == ("ok", "schema: 1 error")
    assert attempt.contract_errors and "$.city" in attempt.contract_errors[0]
    assert s.metric("spillover_contract_flagged_total", target="cloud:a/m") == 1


async def test_an_l2_non_streamed_tool_violation_is_flagged_too(tmp_path: Path) -> None:
    s = setup(tmp_path)
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": BAD_ARGS}}

    async def answering(alias: str, body: dict[str, Any], request_id: str) -> Any:
        reply = await FakeProvider.chat(s.providers["a"], alias, body, request_id)
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return replace(reply, body={**reply.body, "choices": [{"index": 0, "message": message}]})

    s.providers["a"].chat = answering  # type: ignore[method-assign]
    done = await s.send("r1", {**TOOL_BODY, "stream": False}, **{"x-spillover-level": "L2"})
    assert done.headers["x-spillover-contract"] == "schema: 1 error"
    attempt = s.record("r1").attempts[-1]
    assert attempt.contract == "schema: 1 error" and attempt.contract_errors
    assert s.metric("spillover_contract_flagged_total", target="cloud:a/m") == 1


async def test_an_l1_streamed_tool_violation_fails_over_before_the_first_byte(tmp_path: Path) -> None:
    s = setup(tmp_path, {"a": {}, "b": {"domain": "other"}})
    plan = s.dispatcher.plan(derive_contract({"model": "m", **TOOL_BODY}, {}, Policy()), "chat")
    first, second = (t.provider or "" for t in plan.cloud[:2])
    s.providers[first].stream_events = tool_events(BAD_ARGS)
    s.providers[second].stream_events = tool_events(GOOD_ARGS)
    done = await s.send("r1", TOOL_BODY, **{"x-spillover-level": "L1"})
    assert done.target == f"cloud:{second}" and "broke the output contract" in done.reason
    sent = await drain(done)
    arguments = "".join(
        c["function"].get("arguments", "")
        for text in sent[:-1]
        for c in json.loads(text[6:])["choices"][0]["delta"].get("tool_calls", [])
    )
    assert arguments == GOOD_ARGS and sent[-1] == DONE
    attempts = s.record("r1").attempts
    assert [(a.target, a.outcome) for a in attempts] == [
        (f"cloud:{first}/m", "contract_violation"),
        (f"cloud:{second}/m", "ok"),
    ]
    assert attempts[0].completion_tokens == 500 and attempts[0].cost_usd  # the violating answer is paid for


async def test_an_l1_streamed_tool_violation_on_every_target_is_a_502(tmp_path: Path) -> None:
    s = setup(tmp_path)
    s.providers["a"].stream_events = tool_events(BAD_ARGS)
    with pytest.raises(ContractViolation) as caught:
        await s.send("r1", TOOL_BODY, **{"x-spillover-level": "L1"})
    assert caught.value.status_code == 502 and caught.value.errors


async def test_an_l1_tool_violation_after_content_was_sent_ends_the_stream_with_the_error(tmp_path: Path) -> None:
    s = setup(tmp_path)
    s.providers["a"].stream_events = tool_events(BAD_ARGS, content="Let me look that up.")
    done = await s.send("r1", TOOL_BODY, **{"x-spillover-level": "L1"})
    sent: list[str] = []
    with pytest.raises(ContractViolation):
        async for text in done.reply.chunks:  # type: ignore[union-attr]
            sent.append(text)
    assert "Let me look that up." in sent[0] and DONE not in sent
    attempt = s.record("r1").attempts[-1]
    assert (attempt.outcome, attempt.error) == ("contract_violation", "contract_violation")
    assert records(s.log)[0]["attempts"][-1]["outcome"] == "contract_violation"


async def test_an_l1_stream_cut_before_it_showed_content_fails_over(tmp_path: Path) -> None:
    s = setup(tmp_path, {"a": {}, "b": {"domain": "other"}})
    plan = s.dispatcher.plan(derive_contract({"model": "m", **TOOL_BODY}, {}, Policy()), "chat")
    first, second = (t.provider or "" for t in plan.cloud[:2])
    s.providers[first].stream_events = tool_events(GOOD_ARGS)
    s.providers[first].cut = True
    s.providers[second].stream_events = tool_events(GOOD_ARGS)
    done = await s.send("r1", TOOL_BODY, **{"x-spillover-level": "L1"})
    assert done.target == f"cloud:{second}"
    assert (await drain(done))[-1] == DONE
