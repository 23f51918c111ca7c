"""Deadline-aware spill (router/routing/deadline.py and its branches in router/routing/burst.py): the forecast's
arithmetic by hand, and the decision for each case — room and in time (local), room but late (cloud at once),
at the limit and in time (wait, re-planned), at the limit and late or with the waiting room full (cloud), and
local_only requests never sent away."""

from __future__ import annotations

import pytest

from router.routing.burst import BurstInputs, decide
from router.routing.deadline import Load, LocalForecast, Running, StepModel, delay, forecast, harm
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from router.routing.watermarks import Watermarks

NOW = 1000.0
# c 0.1 s, a 0.1 s, b 0.01 s per sequence, g 0.002 s per prefill token, no tail
MODEL = StepModel(request_overhead_s=0.1, step_s=0.1, per_sequence_s=0.01, per_prefill_token_s=0.002)


def load(**kw: float | int | None) -> Load:
    base: dict[str, float | int | None] = dict(
        inflight=3, replicas=1, limit=None, ahead=0, mean_prompt_tokens=100, mean_output_tokens=20
    )
    return Load(**{**base, **kw})  # type: ignore[arg-type]


def test_forecast_with_room_by_hand() -> None:
    f = forecast(MODEL, load(), prefill_tokens=200, output_tokens=10, left_s=5, can_wait=True)
    # n = 3 + 1; TPOT = 0.1 + 0.01·4 + 0.002·3·100/20 = 0.17; e2e = 0.1 + 0.1 + 0.04 + 0.4 + 9·0.17 = 2.17
    assert f.e2e_s == pytest.approx(2.17) and f.wait_s == 0 and f.meets
    assert "3 in flight on 1 replica(s)" in f.detail and "prompt 200 to prefill, 10 to generate" in f.detail
    tail = forecast(
        StepModel(0.1, 0.1, 0.01, 0.002, tail_e2e=2), load(), prefill_tokens=200, output_tokens=10, left_s=4,
        can_wait=True,
    )  # fmt: skip
    assert tail.e2e_s == pytest.approx(4.34) and not tail.meets


def test_forecast_at_the_limit_waits_for_the_rate_requests_leave() -> None:
    f = forecast(MODEL, load(inflight=4, limit=4, ahead=2, replicas=2), prefill_tokens=100, output_tokens=20,
                 left_s=30, can_wait=True)  # fmt: skip
    # per replica n = 2; the mean request: TPOT = 0.1 + 0.02 + 0.002·1·5 = 0.13, e2e = 0.1 + 0.1 + 0.02 + 0.2 +
    # 19·0.13 = 2.89; requests leave at 2 replicas × 2 / 2.89 per second; 3 to go (2 ahead + this one)
    assert f.e2e_s == pytest.approx(2.89)
    assert f.wait_s == pytest.approx(3 / (4 / 2.89))
    assert f.finish_s == pytest.approx(f.wait_s + 2.89) and f.meets
    assert "limit 4, 2 waiting" in f.detail


def stats() -> ReplicaStats:
    return ReplicaStats(
        model="m", replica_id="r", node_id="n", read_at=NOW, kv_cache_usage=0.1, num_running=1, num_waiting=0,
        prefix_cache_queries=0, prefix_cache_hits=0, num_gpu_blocks=100, block_size=16,
    )  # fmt: skip


def decide_with(fc: LocalForecast | None, **kw: object) -> tuple[str, str]:
    base: dict[str, object] = dict(
        model="m", watermarks=Watermarks(), inflight=1, admission_limit=4, local_only=False, providers=("sim",),
        forecast=fc,
    )  # fmt: skip
    snapshot = ClusterSnapshot(taken_at=NOW, replicas=(stats(),), max_age_s=1.0)
    decision = decide(BurstInputs(**{**base, **kw}), snapshot, NOW, frozenset())  # type: ignore[arg-type]
    return decision.route, decision.reason


IN_TIME = LocalForecast(e2e_s=3, wait_s=0, left_s=10, can_wait=True, detail="d")
LATE = LocalForecast(e2e_s=12, wait_s=0, left_s=10, can_wait=True, detail="d")
WAIT_IN_TIME = LocalForecast(e2e_s=3, wait_s=4, left_s=10, can_wait=True, detail="d")
WAIT_LATE = LocalForecast(e2e_s=3, wait_s=8, left_s=10, can_wait=True, detail="d")
ROOM_FULL = LocalForecast(e2e_s=3, wait_s=4, left_s=10, can_wait=False, detail="d")


@pytest.mark.parametrize(
    ("fc", "kw", "route", "reason"),
    [
        (None, {}, "local", "local capacity"),
        (IN_TIME, {}, "local", "local capacity"),
        (LATE, {}, "cloud", "deadline: predicted local e2e 12.0 s, 10.0 s to the deadline (d); local has room"),
        (LATE, {"local_only": True}, "local", "local capacity"),  # never sent away
        (LATE, {"providers": ()}, "local", "local capacity"),  # nowhere else to go
        (None, {"inflight": 4}, "cloud", "inflight 4 >= admission limit 4"),
        (WAIT_IN_TIME, {"inflight": 4}, "wait", "deadline: waiting for local room, predicted local e2e 3.0 s after"),
        (WAIT_LATE, {"inflight": 4}, "cloud", "it would finish late"),
        (ROOM_FULL, {"inflight": 4}, "cloud", "the waiting room is full"),
        (WAIT_LATE, {"inflight": 4, "local_only": True}, "wait", "local_only: waiting"),
    ],
)
def test_decisions(fc: LocalForecast | None, kw: dict[str, object], route: str, reason: str) -> None:
    got_route, got_reason = decide_with(fc, **kw)
    assert got_route == route and reason in got_reason, got_reason


def test_a_newcomer_that_would_make_a_running_request_late_does_harm() -> None:
    # TPOT alone = 0.11 s; a request finishing in 2.2 s has 20 steps left
    in_time = Running(deadline_at=NOW + 3.0, finish_at=NOW + 2.2)
    tight = Running(deadline_at=NOW + 2.5, finish_at=NOW + 2.2)
    already_late = Running(deadline_at=NOW + 1.0, finish_at=NOW + 2.2)
    # 100 prompt tokens and 10 outputs: 0.002·100 + 0.01·10 = 0.3 s more for each
    assert delay(MODEL, in_time, NOW, prefill_tokens=100, output_tokens=10) == pytest.approx(0.3)
    assert delay(MODEL, in_time, NOW, prefill_tokens=0, output_tokens=500) == pytest.approx(0.01 * 20)  # 20 shared
    running = [in_time, tight, already_late]
    assert harm(MODEL, running, NOW, prefill_tokens=100, output_tokens=10) == 0  # 2.5 <= 2.5: still in time
    assert harm(MODEL, running, NOW, prefill_tokens=300, output_tokens=10) == 1  # 0.7 s more: the tight one
    assert harm(MODEL, running, NOW, prefill_tokens=1000, output_tokens=10) == 2  # the late one is not counted
    f = forecast(MODEL, load(), prefill_tokens=1000, output_tokens=10, left_s=60, can_wait=True, running=running,
                 now=NOW)  # fmt: skip
    assert f.harms == 2 and not f.meets and "it would make 2 running request(s) late" in f.line()
    route, reason = decide_with(f)
    assert route == "cloud" and "local has room but would make running requests late" in reason
    assert decide_with(f, local_only=True)[0] == "local"
