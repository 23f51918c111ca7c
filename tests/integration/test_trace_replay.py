"""`spillover bench replay` on the real stack, as an operator runs it (a subprocess): a short slice of the
committed Mooncake trace, scaled down, replayed open-loop through the gateway once per policy (shipped, local,
cloud); every request answered, routed as its policy says, its row linked to the gateway's decision record."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import REPO, SMOL, Stack

pytestmark = pytest.mark.integration
TRACE = REPO / "bench" / "traces" / "mooncake-conversation-10min.jsonl"


def test_replay_a_trace_slice_per_policy(stack: Stack, tmp_path: Path) -> None:
    out = tmp_path / "replay"
    command = [
        sys.executable, "-m", "spillover.main", "bench", "replay", "--url", stack.openai_base, "--model", SMOL,
        "--trace", str(TRACE), "--window-s", "12", "--keep", "0.2", "--input-scale", "0.01",
        "--output-scale", "0.02", "--max-output", "8", "--policies", "shipped,local,cloud",
        "--cloud-region", "local-sim", "--slo-s", "60", "--drain-s", "120", "--cooldown-s", "1",
        "--out", str(out), "--seed", "3",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "[replay shipped]" in done.stderr  # progress while it runs
    data = json.loads((out / "results.json").read_text())
    assert data["trace"]["format"] == "mooncake" and data["scaling"]["spread_s"] == 3.0
    sent = data["window"]["requests"]
    assert sent >= 3
    policies = {p["label"]: p for p in data["policies"]}
    assert list(policies) == ["shipped", "local", "cloud"]
    for label, policy in policies.items():
        m = policy["metrics"]
        assert m["sent"] == sent and m["ok"] == sent and m["unanswered"] == 0, (label, m)
        assert m["slo_attainment"] == 1.0
        assert all(r["output_tokens"] >= 1 and r["prompt_tokens"] for r in policy["requests"])
    assert {r["route"] for r in policies["local"]["requests"]} == {"local"}
    assert policies["local"]["metrics"]["spend_usd"] == 0
    assert {r["route"] for r in policies["cloud"]["requests"]} == {"cloud"}
    assert policies["cloud"]["metrics"]["spend_usd"] > 0
    # a row names the request the gateway answered: its decision record agrees on the route
    row = policies["cloud"]["requests"][0]
    record = httpx.get(f"{stack.openai_base}/spillover/decisions/{row['request_id']}", timeout=10).json()
    assert record["chosen"] == row["target"] and row["target"].startswith("cloud:"), record
    with (out / "requests-local.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == sent
    report = (out / "report.md").read_text()
    assert "| shipped |" in report and "| local |" in report and "| cloud |" in report
    assert (out / "replay_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
