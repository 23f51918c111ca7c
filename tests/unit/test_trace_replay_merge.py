"""`bench replay --merge` (bench/replay/merge.py): replays of the same arrivals against differently configured
gateways become one report; runs of other arrivals, repeated labels and files that are not a replay's results
are refused with one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.replay.merge import merge_results, run_merge
from bench.replay.run import ReplayError, run_replay
from bench.replay.scaling import Scaling
from tests.unit.test_trace_replay_run import REPO, options, scripted_gateway


def replayed(tmp_path: Path, name: str, **kw: Any) -> Path:
    out = tmp_path / name
    run_replay(options(tmp_path, out_dir=str(out), **kw), transport=scripted_gateway([]))
    return out


@pytest.mark.realtime
def test_two_runs_of_the_same_arrivals_make_one_report(tmp_path: Path) -> None:
    limit = replayed(tmp_path, "limit", policies=("shipped",), label="limit")
    deadline = replayed(tmp_path, "deadline", policies=("shipped", "cloud"), label="deadline")
    outcome = run_merge([str(limit), str(deadline)], str(tmp_path / "merged"))
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert [p["label"] for p in merged["policies"]] == ["limit", "deadline", "cloud"]
    assert merged["merged_from"] == [str(limit), str(deadline)] and len(merged["environments"]) == 2
    report = (tmp_path / "merged" / "report.md").read_text()
    assert "| limit |" in report and "| deadline |" in report and "| cloud |" in report
    assert (tmp_path / "merged" / "replay_curve.png").stat().st_size > 0
    assert (tmp_path / "merged" / "requests-deadline.csv").exists() and outcome.exit_code == 0


@pytest.mark.realtime
def test_runs_of_other_arrivals_or_repeated_labels_are_refused(tmp_path: Path) -> None:
    first = replayed(tmp_path, "a", policies=("local",))
    other_seed = replayed(tmp_path, "b", policies=("cloud",), scaling=Scaling(seed=7))
    with pytest.raises(ReplayError, match="scaling differs") as refused:
        merge_results([first, other_seed])
    assert refused.value.exit_code == 2
    again = replayed(tmp_path, "c", policies=("local",))
    with pytest.raises(ReplayError, match=r"policy label.*local.*more than one run"):
        merge_results([first, again])
    with pytest.raises(ReplayError, match="at least two"):
        merge_results([first])


@pytest.mark.parametrize(
    "content",
    ["{not json", "[]", json.dumps({"model": "m"}), "\udcff"],
    ids=["broken", "a list", "another file", "not utf-8"],
)
def test_what_is_not_a_replays_results_is_one_line(tmp_path: Path, content: str) -> None:
    bad = tmp_path / "results.json"
    bad.write_bytes(content.encode("utf-8", "surrogateescape"))
    command = [sys.executable, "-m", "bench", "replay", "--merge", str(bad), str(bad), "--out", str(tmp_path / "o")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: --merge ") and "Traceback" not in done.stderr, done.stderr


def test_a_replay_without_a_trace_says_what_it_needs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "replay", "--url", "http://127.0.0.1:9/v1"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "needs --model, --trace (or --merge DIR...)" in done.stderr, done.stderr
