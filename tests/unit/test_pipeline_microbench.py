"""The routing micro-benchmark runs and reports positive numbers (no timing assertion)."""

from __future__ import annotations

import json

import pytest

from bench.gateway.routing_microbench import main, run_microbench


def test_run_microbench() -> None:
    result = run_microbench(iterations=20, candidates=20)
    assert (result.iterations, result.candidates) == (20, 20)
    assert 0 < result.passed < 20
    assert 0 < result.p50_us <= result.p99_us <= result.max_us


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--iterations", "5", "--candidates", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["candidates"] == 8 and data["p50_us"] > 0 and data["p99_us"] > 0
