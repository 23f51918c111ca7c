"""A recorded run replayed offline: real requests through the real gateway write its JSONL decision
log (`gateway.decisions_log`), then `spillover replay` (a subprocess, as an operator runs it) re-runs
a policy that forbids the `cloud-sim` provider over that log and must report exactly the requests
that went to cloud-sim as moved, and every other one as unchanged. On the way, a feedback report on
one of the answers reaches the per-bucket quality view and /metrics."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from cluster.config.deployment import dump_config
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

SMOL = "smollm2-135m-instruct"
TOOL = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
}


def _log_lines(path: Path, wanted: set[str], timeout_s: float = 20) -> list[dict]:
    """The log's blob lines and the records of `wanted` (the writer is a background thread)."""
    deadline = time.monotonic() + timeout_s
    while True:
        items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        found = {i["request_id"] for i in items if "kind" not in i and i["request_id"] in wanted}
        if found == wanted:
            return [i for i in items if "kind" in i or i["request_id"] in wanted]
        assert time.monotonic() < deadline, f"records missing from the decision log: {sorted(wanted - found)}"
        time.sleep(0.2)


def _feedback_reaches_quality(stack: Stack, request_id: str) -> None:
    """A late verdict on a real answer is stored and lands in the per-bucket quality and /metrics."""
    body = {"request_id": request_id, "outcome": "failure", "source": "integration-test"}
    reply = httpx.post(f"{stack.openai_base}/spillover/feedback", json=body, timeout=10)
    assert reply.status_code == 200 and reply.json()["applied"]["quality"] is True, reply.text
    again = httpx.post(f"{stack.openai_base}/spillover/feedback", json=body, timeout=10)
    assert again.status_code == 409 and again.json()["error"]["code"] == "feedback_exists"
    quality = httpx.get(f"{stack.openai_base}/spillover/quality", timeout=10).json()
    buckets = quality["targets"][f"local:{SMOL}"]
    assert sum(b["feedback"] for b in buckets.values()) >= 1 and sum(b["failures"] for b in buckets.values()) >= 1
    assert "spillover_quality_samples{" in httpx.get(f"{stack.base_url}/metrics", timeout=10).text


def test_a_policy_forbidding_a_provider_moves_exactly_its_requests(stack: Stack, tmp_path: Path) -> None:
    client = openai.OpenAI(base_url=stack.openai_base, api_key="unused", max_retries=0, timeout=120)
    run = uuid.uuid4().hex[:8]
    targets: dict[str, str] = {}
    for i in range(6):
        tools = i % 2 == 1  # the local model has no tool calling: these go to the cloud
        request_id = f"replay-{run}-{'tools' if tools else 'plain'}-{i}"
        raw = client.chat.completions.with_raw_response.create(
            model=SMOL,
            messages=[{"role": "user", "content": f"Say the number {i}."}],
            max_tokens=4,
            temperature=0,
            extra_headers={"x-request-id": request_id},
            **({"tools": [TOOL]} if tools else {}),  # type: ignore[arg-type]
        )
        targets[request_id] = raw.headers["x-spillover-target"]
    to_sim = {rid for rid, target in targets.items() if target == "cloud:cloud-sim"}
    assert to_sim and len(to_sim) < len(targets), targets
    _feedback_reaches_quality(stack, next(rid for rid, target in targets.items() if target.startswith("local:")))

    log_path = Path(str(stack.config.gateway.decisions_log))
    subset = tmp_path / "decisions.jsonl"
    lines = _log_lines(log_path, set(targets))
    subset.write_text("".join(json.dumps(i) + "\n" for i in lines))
    raw = dump_config(stack.config)
    default = raw["policy"]["scenarios"]["default"]
    others = [p["name"] for p in raw["cloud"]["providers"] if p["name"] != "cloud-sim"]
    default["allowed_targets"] = ["local:*", *(f"cloud:{name}/*" for name in others)]
    raw["policy"]["version"] = "local-1-without-cloud-sim"
    policy = tmp_path / "no-cloud-sim.yaml"
    policy.write_text(yaml.safe_dump(raw))

    command = [sys.executable, "-m", "spillover.main", "replay", "--policy", str(policy), "--decisions", str(subset)]
    done = subprocess.run([*command, "--json", "--max-changed-pct", "100"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    outcomes = {r["request_id"]: r for r in report["requests"]}
    assert set(outcomes) == set(targets)
    moved = {rid for rid, r in outcomes.items() if r["outcome"] != "same"}
    assert moved == to_sim
    for rid in moved:
        assert outcomes[rid]["outcome"] == "moved" and outcomes[rid]["old_target"] == f"cloud:cloud-sim/{SMOL}"
        assert not outcomes[rid]["new_target"].startswith("cloud:cloud-sim/")
    assert report["summary"]["newly_removed"][f"cloud:cloud-sim/{SMOL} by allowed_targets"]["requests"] == 6
    table = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert table.returncode == 1 and "guards: TRIPPED" in table.stdout  # 10% by default
    (tmp_path / "report.json").write_text(done.stdout)
    (tmp_path / "report.txt").write_text(table.stdout)
