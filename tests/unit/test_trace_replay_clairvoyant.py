"""The clairvoyant schedule (bench/replay/clairvoyant.py): it keeps a request local only where the fitted engine
finishes every admitted request in time, so it never sends fewer to the cloud than the offline lower bound says any
scheduler must, and a request the engine serves in time alone and unhurried stays local."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bench.replay.bound import cloud_bound
from bench.replay.clairvoyant import Sequence, _all_in_time, _step, clairvoyant
from tests.unit.test_trace_replay_bound import TERMS, req
from tests.unit.test_trace_replay_run import REPO, write_trace


def test_one_step_by_hand() -> None:
    # a decoding sequence and a 3,000-token prompt: 1 decode + 2,047 prompt tokens fit the 2,048 budget
    running = [Sequence(0, 5, 99.0), Sequence(3000, 4, 99.0)]
    after, duration, done = _step(running, TERMS.step_s, TERMS.per_sequence_s, TERMS.per_prefill_token_s)
    assert duration == pytest.approx(0.1 + 0.01 * 2 + 0.001 * 2047)
    assert after == [Sequence(0, 4, 99.0), Sequence(953, 4, 99.0)] and done == []


def test_alone_in_time_stays_local_and_too_slow_leaves() -> None:
    # alone: 1 prefill step (0.1 + 0.01 + 0.5) then 19 decode steps of 0.11: 2.7 s
    assert clairvoyant((req(0, 500, 20),), TERMS, slo_s=3).cloud == 0
    assert clairvoyant((req(0, 500, 20),), TERMS, slo_s=2).cloud == 1
    assert _all_in_time([Sequence(500, 20, 2.71)], 0.0, TERMS)
    assert not _all_in_time([Sequence(500, 20, 2.6)], 0.0, TERMS)


def test_a_burst_keeps_what_fits_and_sends_the_rest() -> None:
    burst = tuple(req(0, 1000, 50) for _ in range(10))
    schedule = clairvoyant(burst, TERMS, slo_s=10)
    assert 0 < schedule.cloud < 10 and schedule.share == schedule.cloud / 10
    spread = tuple(req(10.0 * i, 1000, 50) for i in range(10))
    assert clairvoyant(spread, TERMS, slo_s=10).cloud == 0


@pytest.mark.parametrize("seed", range(20))
def test_never_fewer_than_the_lower_bound(seed: int) -> None:
    rng = random.Random(seed)
    requests = tuple(
        sorted(
            (req(round(rng.uniform(0, 20), 2), rng.randint(50, 3000), rng.randint(1, 60)) for _ in range(40)),
            key=lambda r: r.arrival_s,
        )
    )
    bound, schedule = cloud_bound(requests, TERMS, slo_s=8), clairvoyant(requests, TERMS, slo_s=8)
    assert bound.requests <= schedule.cloud, (bound, schedule)


def test_bound_only_sends_nothing_and_prints_both(tmp_path: Path) -> None:
    fit = tmp_path / "fit.yaml"
    # one fit is the one asked for, whatever CPU this runs on
    perf = {"request_overhead_s": 0.0, "step_s": 0.1, "per_sequence_s": 0.01, "per_prefill_token_s": 0.002,
            "cpu": "avx512"}  # fmt: skip
    fit.write_text(json.dumps({"models": [{"alias": "m", "perf": perf}]}))
    base = [
        sys.executable,
        "-m",
        "bench",
        "replay",
        "--bound-only",
        "--model",
        "m",
        "--trace",
        str(write_trace(tmp_path)),
    ]
    done = subprocess.run([*base, "--perf-from", str(fit)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "offline lower bound 0.0%" in done.stdout and "clairvoyant schedule: 0.0%" in done.stdout, done.stdout
    bare = subprocess.run(base, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bare.returncode == 2 and "--bound-only needs --perf-from" in bare.stderr, bare.stderr
