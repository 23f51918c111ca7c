"""`spillover traffic`: the argument → command body mapping, the POST through the gateway client
(key from the environment, the gateway's error quoted), and the text view."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from router.errors import ClusterError
from spillover.gateway_client import get_json
from spillover.main import build_parser
from spillover.traffic import command_body, render


def body_of(*argv: str) -> dict[str, object] | None:
    return command_body(build_parser().parse_args(["traffic", *argv]))


def test_each_command_becomes_its_body(tmp_path: Path) -> None:
    assert body_of("show") is None
    assert body_of("drain", "cloud:sim", "--reason", "upgrade") == {
        "action": "drain",
        "target": "cloud:sim",
        "reason": "upgrade",
    }
    assert body_of("pin", "m", "cloud:sim", "--scenario", "chat") == {
        "action": "pin",
        "model": "m",
        "target": "cloud:sim",
        "scenario": "chat",
    }
    sample = tmp_path / "sample.json"
    sample.write_text(json.dumps({"response_format": {"type": "json_object"}}))
    switch = body_of(
        "switch", "m", "--primary", "local:m", "--standby", "cloud:sim", "--step-s", "5", "--dry-run-file", str(sample)
    )
    assert switch == {
        "action": "switch",
        "model": "m",
        "primary": "local:m",
        "standby": "cloud:sim",
        "step_s": 5.0,
        "dry_run": {"response_format": {"type": "json_object"}},
    }
    assert body_of("rollback", "m") == {"action": "rollback", "model": "m"}


def test_a_bad_dry_run_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ClusterError, match="--dry-run-file"):
        body_of("switch", "m", "--primary", "local:m", "--standby", "cloud:sim", "--dry-run-file", str(bad))


def test_a_switch_needs_primary_and_standby() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["traffic", "switch", "m", "--standby", "cloud:sim"])


def test_the_post_carries_the_key_and_a_refusal_quotes_the_gateway() -> None:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        error = {"error": {"message": "cloud:sim failed the dry-run", "code": "dry_run_failed"}}
        return httpx.Response(409, json=error)

    with pytest.raises(ClusterError, match="409: dry_run_failed: cloud:sim failed the dry-run"):
        get_json("http://gw", "/v1/spillover/traffic", "K", {"K": "sk-ops"}, httpx.MockTransport(handle), body={"a": 1})
    assert seen[0].method == "POST" and json.loads(seen[0].content) == {"a": 1}
    assert seen[0].headers["authorization"] == "Bearer sk-ops"


def test_the_view_lists_drains_pins_and_switches() -> None:
    doc = {
        "version": 3,
        "drains": {"local:m": {"reason": "upgrade"}},
        "pins": {"m/chat": {"target": "cloud:sim"}},
        "switches": {"m": {"primary": "local:m", "standby": "cloud:sim", "phase": "running"}},
        "migrations": {"m": {"share": 0.25, "events": [{"kind": "step", "reason": "gates passed at 5%"}]}},
    }
    text = render(doc)
    assert "drained  local:m  (upgrade)" in text and "pinned   m/chat -> cloud:sim" in text
    assert "local:m -> cloud:sim  running  at 25%" in text and "gates passed at 5%" in text
    assert "no drains" in render({"version": 0})


def test_explain_shows_the_graded_switch_a_request_ran_under() -> None:
    from spillover.explain import render as explain

    record = {
        "request_id": "r",
        "policy_version": "1",
        "contract": {"model": "m", "scenario": "default", "level": "L2", "strategy": "quality"},
        "candidates": [],
        "tiers": [[], []],
        "traffic": "m: local:m -> cloud:sim running at 25%: standby",
    }
    assert "graded switch: m: local:m -> cloud:sim running at 25%: standby" in explain(record)
