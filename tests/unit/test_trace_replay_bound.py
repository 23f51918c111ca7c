"""The offline lower bound on the cloud share (bench/replay/bound.py), by hand: requests too slow even alone,
windows whose local work cannot fit (the fewest, largest first), prefix blocks credited once, and against a brute
force over every subset on small random traces (the bound never exceeds the true minimum of its own relaxation)."""

from __future__ import annotations

import itertools
import random

import pytest

from bench.replay.bound import StepTerms, cloud_bound, unshared_prompts
from bench.replay.scaling import ScaledRequest

TERMS = StepTerms(request_overhead_s=0.0, step_s=0.1, per_sequence_s=0.01, per_prefill_token_s=0.001)


def req(
    arrival: float, prompt: int, output: int, blocks: tuple[int, ...] = (), block_words: int | None = None
) -> ScaledRequest:
    return ScaledRequest(arrival, prompt, output, blocks, block_words, 0, prompt, output)


def test_a_request_too_slow_alone_must_leave() -> None:
    # 100 outputs × (0.1 + 0.01) = 11 s > 10 s; 50 outputs: 5.5 s
    bound = cloud_bound((req(0, 10, 100), req(1, 10, 50)), TERMS, slo_s=10)
    assert (bound.requests, bound.alone, bound.share) == (1, 1, 0.5)


def test_a_window_that_cannot_hold_its_work() -> None:
    # each: b·O + g·P = 0.01 × 50 + 0.001 × 1000 = 1.5 s of engine work, and 50 steps of a = 0.1 s for any batch
    # of them; 10 arriving at once, due in 10 s: 5 s of steps + 15 s of work in a 10 s window: 7 must leave (6
    # would leave 5 + 6 s)
    burst = tuple(req(0, 1000, 50) for _ in range(10))
    bound = cloud_bound(burst, TERMS, slo_s=10)
    assert bound.requests == 7 and bound.window == (0, 10) and bound.alone == 0
    # two replicas: 20 s of room for the work, but not for the latency: each request's 50 steps are slowed by the
    # others in its batch and their prefills, a·T + g·P + a·b·T² / (L·R − b·T − g·P) = 50 + 10 + 25 / 5 s = 110 s
    # of the ten's own steps > 10 × 10 s; nine pass (54 + 20.25 / 6.5 = 85.2 s ≤ 90 s); three replicas hold all
    assert cloud_bound(burst, TERMS, slo_s=10, replicas=2).requests == 1
    assert cloud_bound(burst, TERMS, slo_s=10, replicas=3).requests == 0
    spread = tuple(req(5.0 * i, 1000, 50) for i in range(10))  # one every 5 s: always room
    assert cloud_bound(spread, TERMS, slo_s=10).requests == 0


def test_shared_blocks_are_prefilled_once() -> None:
    a = req(0, 30, 5, (1, 2, 3), block_words=10)
    b = req(1, 30, 5, (1, 2, 4), block_words=10)
    c = req(2, 25, 5, (5, 6, 7), block_words=10)
    assert unshared_prompts((a, b, c)) == [30, 10, 25]
    assert unshared_prompts((req(0, 40, 1), req(0, 40, 1))) == [40, 40]  # no blocks: no credit


def brute_force(requests: list[ScaledRequest], slo_s: float, terms: StepTerms = TERMS, latency: bool = True) -> int:
    """The fewest requests to remove so that every window's steps and work fit and (with `latency`) its requests'
    own steps pass within their SLOs (both conditions of the module docstring, on the exact set), by trying every
    subset."""
    a, b, g = terms.step_s, terms.per_sequence_s, terms.per_prefill_token_s
    works = [b * r.output_tokens + g * r.input_tokens for r in requests]

    def fits(kept: list[int], s: float, t: float) -> bool:
        inside = [i for i in kept if requests[i].arrival_s >= s and requests[i].arrival_s + slo_s <= t]
        steps = max((requests[i].output_tokens for i in inside), default=0)
        if a * steps + sum(works[i] for i in inside) > t - s + 1e-12:
            return False
        if not latency:
            return True
        tokens = sum(requests[i].output_tokens for i in inside)
        prefill = sum(requests[i].input_tokens for i in inside)
        steps_room = t - s - b * tokens - g * prefill
        if not inside:
            return True
        if steps_room <= 0:
            return False
        own_steps = a * tokens + g * prefill + a * b * tokens**2 / steps_room
        return own_steps <= len(inside) * (slo_s - terms.request_overhead_s) + 1e-12

    for k in range(len(requests) + 1):
        for removed in itertools.combinations(range(len(requests)), k):
            kept = [i for i in range(len(requests)) if i not in removed]
            starts = [requests[i].arrival_s for i in kept]
            ends = [requests[i].arrival_s + slo_s for i in kept]
            if all(fits(kept, s, t) for s in starts for t in ends if t > s):
                return k
    return len(requests)


@pytest.mark.parametrize("seed", range(12))
def test_never_more_than_the_relaxations_own_minimum(seed: int) -> None:
    rng = random.Random(seed)
    requests = sorted(
        (req(round(rng.uniform(0, 6), 1), rng.randint(100, 3000), rng.randint(1, 30)) for _ in range(7)),
        key=lambda r: r.arrival_s,
    )
    bound = cloud_bound(tuple(requests), TERMS, slo_s=8)
    assert bound.alone == 0  # at most 30 × 0.11 + 3,000 × 0.001 = 6.3 s alone
    assert bound.requests <= brute_force(requests, 8)


@pytest.mark.parametrize("seed", range(12))
def test_tight_where_it_is_exact_on_a_burst_in_two_waves(seed: int) -> None:
    """Two bursts far apart, each of a few requests: the windows share no request, so the bound is at least the
    sum of each burst's exact fewest for the work to fit (the throughput condition alone), and at most the fewest
    for both conditions on every window at once (the latency condition is taken per window, and windows of one
    burst that overlap are not summed)."""
    rng = random.Random(seed)
    waves = [round(rng.uniform(0, 1), 2) for _ in range(4)] + [round(rng.uniform(30, 31), 2) for _ in range(4)]
    requests = [req(t, rng.randint(500, 3000), rng.randint(5, 40)) for t in sorted(waves)]
    bound = cloud_bound(tuple(requests), TERMS, slo_s=6)
    assert brute_force(requests, 6, latency=False) <= bound.requests <= brute_force(requests, 6)
