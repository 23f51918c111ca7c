"""Decision records: built from a pipeline run, attempts with cost (failures too), JSON round trip,
and the bounded store with its JSONL sink."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

from router.learning.decision import Attempt, Candidate, DecisionRecord, DecisionStore
from router.request.contract import derive_contract
from router.routing.capabilities import ProviderModel, cloud_target, local_target
from router.routing.pipeline import run_pipeline
from router.routing.plugins import TargetState
from router.routing.policy import Policy

POLICY = Policy(version="2025-06-01")
LOCAL = local_target("qwen", {"max_model_len": 4096})
CLOUD = cloud_target(
    "openai",
    "qwen",
    ProviderModel(
        name="gpt", snapshot="gpt-1", context_window=8192, region="us", price_in_per_mtok=2, price_out_per_mtok=8
    ),
)
DOWN = cloud_target(
    "down",
    "qwen",
    ProviderModel(
        name="m", snapshot="m-1", context_window=8192, region="us", price_in_per_mtok=1, price_out_per_mtok=1
    ),
)
BARE = cloud_target("bare", "qwen", "some-model")


def _clock() -> itertools.count[float]:
    return itertools.count(100.0, 0.5)  # type: ignore[return-value]


def _record(request_id: str = "req-1") -> DecisionRecord:
    contract = derive_contract({"model": "qwen", "messages": [{"role": "user", "content": "hi"}]}, {}, POLICY)
    result = run_pipeline(contract, [LOCAL, CLOUD, DOWN, BARE], {DOWN.id: TargetState(available=False)}, POLICY)
    ticks = _clock()
    return DecisionRecord.from_pipeline(request_id, POLICY, contract, result, clock=lambda: next(ticks))


def test_record_from_pipeline() -> None:
    record = _record()
    assert (record.request_id, record.policy_version, record.started_at) == ("req-1", "2025-06-01", 100.0)
    assert record.contract["scenario"] == "default"
    assert record.tiers == (("local:qwen",), ("cloud:openai/qwen",))
    by_id = {c.target: c for c in record.candidates}
    assert by_id["cloud:bare/qwen"] == Candidate(
        "cloud:bare/qwen",
        "removed",
        "capabilities_known",
        "capabilities unknown (configure them; never inferred from the model name)",
    )
    assert by_id["cloud:down/qwen"].status == "unavailable"
    ranked = by_id["local:qwen"]
    assert ranked.status == "ranked" and ranked.total is not None
    assert set(ranked.scores or {}) == {"quality", "cost", "latency", "locality"}
    assert set((ranked.scores or {})["quality"]) == {"raw", "score", "weight"}


def test_attempts_cost_includes_failures() -> None:
    failed = Attempt.priced(CLOUD, "error", 2.0, prompt_tokens=1000, completion_tokens=900, error="provider_cut")
    assert failed.cost_usd == pytest.approx((1000 * 2 + 900 * 8) / 1e6)
    ok = Attempt.priced(LOCAL, "ok", 0.7, prompt_tokens=1000, completion_tokens=950)
    assert ok.cost_usd == 0
    unpriced = Attempt.priced(BARE, "error", 0.1, 10, 0, error="provider_error")
    assert unpriced.cost_usd is None

    ticks = _clock()
    record = _record().with_attempt(failed).with_attempt(ok).finished("local:qwen", clock=lambda: next(ticks))
    assert record.attempts == (failed, ok)
    assert (record.chosen, record.finished_at) == ("local:qwen", 100.0)
    assert record.total_cost_usd == pytest.approx(failed.cost_usd)
    assert record.with_attempt(unpriced).total_cost_usd == record.total_cost_usd  # an unknown cost adds nothing


def test_json_round_trip() -> None:
    attempt = Attempt.priced(CLOUD, "ok", 1.25, 100, 20)
    record = _record().with_attempt(attempt).finished("cloud:openai/qwen", clock=lambda: 123.0)
    line = record.to_json()
    assert "\n" not in line
    data = json.loads(line)
    assert data["total_cost_usd"] == pytest.approx(attempt.cost_usd)
    assert data["tiers"] == [["local:qwen"], ["cloud:openai/qwen"]]
    assert DecisionRecord.from_json(line) == record


def test_store_evicts_the_oldest() -> None:
    store = DecisionStore(max_records=2)
    for i in range(3):
        store.put(_record(f"r{i}"))
    assert len(store) == 2
    assert store.get("r0") is None
    assert [r.request_id for r in store.recent()] == ["r1", "r2"]


def test_store_put_replaces_and_refreshes() -> None:
    store = DecisionStore(max_records=2)
    store.put(_record("a"))
    store.put(_record("b"))
    updated = _record("a").finished("local:qwen", clock=lambda: 1.0)
    store.put(updated)  # "a" is now the newest
    store.put(_record("c"))
    assert store.get("b") is None
    assert store.get("a") == updated
    assert [r.request_id for r in store.recent(1)] == ["c"]


def test_store_sink_gets_one_json_line_per_put() -> None:
    lines: list[str] = []
    store = DecisionStore(max_records=1, sink=lines.append)
    store.put(_record("a"))
    store.put(_record("b"))
    assert [json.loads(line)["request_id"] for line in lines] == ["a", "b"]
    assert DecisionRecord.from_json(lines[0]) == _record("a")


def test_store_needs_room() -> None:
    with pytest.raises(ValueError, match="max_records"):
        DecisionStore(max_records=0)


def test_a_record_put_before_its_stream_ended_reaches_the_sink_once_amended() -> None:
    lines: list[str] = []
    store = DecisionStore(sink=lines.append)
    assert store.claim("s-1", "tenant-a")
    pending = _record("s-1").with_attempt(Attempt("cloud:sim/m", "streaming", 0.1))
    store.put(pending, final=False)
    store.release("s-1", "tenant-a")  # the gateway releases the claim when the first byte leaves
    assert lines == [] and store.get("s-1", "tenant-a") == pending
    final = replace(pending, attempts=(Attempt("cloud:sim/m", "cut", 2.0, 10, 3, 0.1),))
    store.finalise(final)
    assert [json.loads(line)["attempts"][0]["outcome"] for line in lines] == ["cut"]
    assert store.get("s-1", "tenant-a") == final  # still the owner's record
    assert store.get("s-1", "") is None


def test_amending_an_id_that_now_holds_a_later_request_only_writes_the_log() -> None:
    lines: list[str] = []
    store = DecisionStore(sink=lines.append)
    first = _record("s-2")
    store.put(first, final=False)
    later = replace(first, started_at=first.started_at + 5)
    store.put(later)
    store.finalise(first)
    assert store.get("s-2") == later and len(lines) == 2
