"""Offline replay of recorded decisions under a new policy (router/learning/replay.py) over a recorded run of
the real dispatcher, and the compact records it needs (router/learning/decision_inputs.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cluster.decision_log_reader import read_decision_log
from router.learning.replay import ReplayGuards, ReplayReport, replay
from router.routing.capabilities import Registry
from tests.unit.replay_world import REQUESTS, make_config, record_run

FORBID_SIM = {
    "version": "v2-no-sim",
    "scenarios": {
        "default": {"level": "L2", "allowed_targets": ["local:*", "cloud:sim2/*"]},
        "private": {"level": "L1", "residency": "local_only"},
    },
}


def replayed(tmp_path: Path, policy: dict[str, Any] | None, guards: ReplayGuards | None = None) -> ReplayReport:
    log_path = tmp_path / "decisions.jsonl"
    if not log_path.exists():
        record_run(log_path)
    log = read_decision_log(log_path)
    config = make_config(policy)
    registry = Registry.from_config(config.models, config.cloud.providers)
    return replay(
        log.records, log.blobs, config.policy, registry, guards=guards or ReplayGuards(), malformed=log.malformed
    )


def by_id(report: ReplayReport) -> dict[str, Any]:
    return {r.request_id: r for r in report.requests}


def test_records_carry_inputs_policy_version_and_snapshot_with_schemas_once(tmp_path: Path) -> None:
    lines = [json.loads(line) for line in record_run(tmp_path / "log.jsonl")]
    records = [x for x in lines if "kind" not in x]
    blobs = [x for x in lines if "kind" in x]
    assert [r["request_id"] for r in records] == [r[0] for r in REQUESTS]
    schema_ids = {r["contract"].get("json_schema_id") for r in records} - {None}
    assert len(schema_ids) == 1  # both schema requests quote the same schema ...
    assert sum(1 for b in blobs if b["id"] in schema_ids) == 1  # ... written once
    assert all("json_schema" not in r["contract"] for r in records)  # never the schema itself
    assert all(r["policy_version"] == "v1" and r["snapshot_id"] for r in records)
    snapshots = {b["id"]: b["body"] for b in blobs if b["kind"] == "snapshot"}
    assert len(snapshots) == 1  # the same capabilities and health for every request: one snapshot line
    (snap,) = snapshots.values()
    assert set(snap["targets"]) == {"local:m", "cloud:sim/m", "cloud:sim2/m"}
    assert snap["available_providers"] == ["sim", "sim2"]
    private = next(r for r in records if r["request_id"] == "private-1")
    assert private["contract"]["inputs"] == {"x-business-scenario": "private"}
    tools = next(r for r in records if r["request_id"] == "tools-1")
    assert tools["contract"]["tool_schema_ids"]["lookup"] in {b["id"] for b in blobs}


def test_same_policy_changes_nothing(tmp_path: Path) -> None:
    report = replayed(tmp_path, None)
    assert [r.outcome for r in report.requests] == ["same"] * len(REQUESTS)
    assert report.changed_pct == 0 and report.tripped == ()
    assert report.cloud_share(False) == report.cloud_share(True) == 2 / 6


def test_a_policy_forbidding_a_provider_moves_exactly_its_requests(tmp_path: Path) -> None:
    report = replayed(tmp_path, FORBID_SIM, ReplayGuards(max_changed_pct=50))
    moved = {r.request_id: (r.old_target, r.new_target) for r in report.requests if r.outcome != "same"}
    assert moved == {"tools-1": ("cloud:sim/m", "cloud:sim2/m"), "tools-2": ("cloud:sim/m", "cloud:sim2/m")}
    summary = report.summary()
    assert summary["moves"] == {"cloud:sim/m -> cloud:sim2/m": 2}
    # every default-scenario request lost the sim candidate (private-1 never had it: local_only)
    assert summary["newly_removed"]["cloud:sim/m by allowed_targets"]["requests"] == 5
    assert summary["expected_cost_usd"]["new"] > summary["expected_cost_usd"]["old"]  # sim2 is dearer
    assert summary["cloud_share"] == {"old": round(2 / 6, 4), "new": round(2 / 6, 4)}
    assert report.tripped == ()
    assert ReplayReport(report.policy_version, report.requests, ReplayGuards(max_changed_pct=10)).tripped


def test_local_only_policy_makes_tool_requests_no_capable_model_and_trips_the_guard(tmp_path: Path) -> None:
    policy = {"version": "v3", "scenarios": {"default": {"allowed_targets": ["local:*"]}, "private": {}}}
    report = replayed(tmp_path, policy, ReplayGuards(max_changed_pct=100))
    outcomes = {r.request_id: r.outcome for r in report.requests}
    assert outcomes["tools-1"] == outcomes["tools-2"] == "no_capable_model"
    assert "local:m: tools (function calling) not supported" in by_id(report)["tools-1"].why
    assert report.tripped == ("2 requests become no_capable_model (guard: at most 0)",)
    assert report.cloud_share(True) == 0.0


def test_a_scenario_the_new_policy_drops_is_rejected_with_its_code(tmp_path: Path) -> None:
    report = replayed(tmp_path, {"version": "v4", "scenarios": {"default": {}}})
    private = by_id(report)["private-1"]
    assert private.outcome == "rejected" and private.why.startswith("unknown_scenario: unknown scenario")
    assert sum(r.outcome == "same" for r in report.requests) == 5


def test_a_stricter_level_reroutes_to_l1_capable_targets_only(tmp_path: Path) -> None:
    policy = {"version": "v5", "scenarios": {"default": {"level": "L1", "strategy": "cost"}, "private": {}}}
    report = replayed(tmp_path, policy, ReplayGuards(max_changed_pct=100))
    assert {r.outcome for r in report.requests} == {"same"}  # every target here is on_prem / no_retention


def test_recorded_unavailable_targets_stay_out(tmp_path: Path) -> None:
    log_path = tmp_path / "decisions.jsonl"
    record_run(log_path)
    log = read_decision_log(log_path)
    for blob in log.blobs.values():
        if blob["kind"] == "snapshot":  # as if sim's breaker was open when these were recorded
            blob["body"]["unavailable"] = {"cloud:sim/m": "breaker open"}
    config = make_config(None)
    registry = Registry.from_config(config.models, config.cloud.providers)
    report = replay(log.records, log.blobs, config.policy, registry, guards=ReplayGuards(max_changed_pct=100))
    assert by_id(report)["tools-1"].new_target == "cloud:sim2/m"


def test_records_without_inputs_or_with_missing_schemas_are_skipped_not_raised(tmp_path: Path) -> None:
    log_path = tmp_path / "decisions.jsonl"
    record_run(log_path)
    log = read_decision_log(log_path)
    schema_blobs = [k for k, b in log.blobs.items() if b["kind"] == "schema"]
    blobs = {k: b for k, b in log.blobs.items() if k not in schema_blobs}
    old = dict(log.records[0])
    old["contract"] = {k: v for k, v in old["contract"].items() if k != "inputs"}  # an older record
    weird = [
        {"request_id": "w1", "contract": {"inputs": {}}, "tiers": "xx", "attempts": [7]},
        {"request_id": "w2\x1b[2J"},
    ]
    config = make_config(None)
    registry = Registry.from_config(config.models, config.cloud.providers)
    report = replay([old, *log.records[1:], *weird], blobs, config.policy, registry)
    outcomes = {r.request_id: (r.outcome, r.why) for r in report.requests}
    assert outcomes["plain-1"][0] == "skipped" and "no contract inputs" in outcomes["plain-1"][1]
    assert outcomes["schema-1"] == ("skipped", "a schema it quotes is not in the log")
    assert outcomes["w1"][0] == outcomes["w2?[2J"][0] == "skipped"  # an escape sequence is never printed
    assert outcomes["private-1"][0] == "same"
