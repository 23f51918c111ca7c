"""The compute bound: the largest concurrency whose predicted p95 meets the SLO (cluster/capacity/compute_model.py).

The predicted p95 at concurrency N is the p95 of the engine simulation (cluster/capacity/engine_sim.py: the
fitted step time, vLLM's token budget and chunked prefill, a closed loop that starts with N requests
at once) times the fitted tail (the spread the simulation does not have: noise, stragglers):

    p95(N) = tail × p95 of simulate(N, requests(N))
    knee   = max { N ≥ 1 : p95_e2e(N) ≤ S_e2e and p95_ttft(N) ≤ S_ttft }   (the SLOs given)

p95(N) rises with N (more sequences per step, more prompts ahead of the last one of a burst), so the
knee is found by doubling N until the SLO breaks, then bisecting; the steps show p95 at the knee and
at knee + 1. `ceiling` (the memory bound, when known) ends the search: a p95 still within the SLO
there means compute does not bind (concurrency None). Without a ceiling the search ends at
MAX_SEARCH. Pure and deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from cluster.capacity.compute_model import ComputeKnee, PerfParams, Workload
from cluster.capacity.engine_sim import EngineLimits, Protocol, simulate

MAX_SEARCH = 4096


def predicted_p95(
    params: PerfParams, workload: Workload, limits: EngineLimits, protocol: Protocol, concurrency: int
) -> dict[str, float]:
    """{"e2e": p95 s, "ttft": p95 s} at N, tails applied."""
    run = simulate(params, workload, limits, concurrency, protocol.requests(concurrency))
    return {"e2e": run.p95_s("e2e") * params.tail_e2e, "ttft": run.p95_s("ttft") * params.tail_ttft}


def compute_knee(
    params: PerfParams,
    workload: Workload,
    *,
    slo_e2e_p95_s: float | None = None,
    slo_ttft_p95_s: float | None = None,
    limits: EngineLimits | None = None,
    protocol: Protocol | None = None,
    ceiling: int | None = None,
) -> ComputeKnee:
    """The compute bound for the SLOs given (at least one), with its arithmetic (see the module docstring)."""
    slos = {m: s for m, s in (("e2e", slo_e2e_p95_s), ("ttft", slo_ttft_p95_s)) if s is not None}
    if not slos:
        raise ValueError("the compute bound needs an SLO: slo_e2e_p95_s or slo_ttft_p95_s")
    for value in slos.values():
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"an SLO must be a finite number of seconds > 0, got {value}")
    limits, protocol = limits or EngineLimits(), protocol or Protocol()
    top = min(ceiling, MAX_SEARCH) if ceiling is not None else MAX_SEARCH
    cache: dict[int, dict[str, float]] = {}

    def p95_at(n: int) -> dict[str, float]:
        if n not in cache:
            cache[n] = predicted_p95(params, workload, limits, protocol, n)
        return cache[n]

    def meets(n: int) -> bool:
        return all(p95_at(n)[m] <= s for m, s in slos.items())

    knee = _largest(meets, top)
    binding = _binding(slos, p95_at(knee + 1)) if knee < top else next(iter(slos))
    steps = _steps(params, workload, limits, protocol, slos, knee, top, p95_at)
    return ComputeKnee(None if knee >= top and top > 0 else knee, binding, tuple(steps))


def _largest(meets: Callable[[int], bool], top: int) -> int:
    """The largest N in [0, top] with meets(N), assuming meets holds below some N and fails above it."""
    if top < 1 or not meets(1):
        return 0
    low, high = 1, 2
    while high <= top and meets(high):
        low, high = high, high * 2
    if high > top:
        if meets(top):
            return top
        high = top
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if meets(mid) else (low, mid)
    return low


def _binding(slos: dict[str, float], above: dict[str, float]) -> str:
    """The SLO that breaks first above the knee (the largest p95 / SLO there)."""
    return max(slos, key=lambda m: above[m] / slos[m])


def _steps(
    params: PerfParams,
    workload: Workload,
    limits: EngineLimits,
    protocol: Protocol,
    slos: dict[str, float],
    knee: int,
    top: int,
    p95_at: Callable[[int], dict[str, float]],
) -> list[tuple[str, float, str]]:
    p = params
    pu = float(workload.prefill_tokens)
    steps: list[tuple[str, float, str]] = [
        (
            "prefill tokens per request",
            _num(pu),
            f"P_u = {_num(workload.prompt_tokens)} × (1 − {workload.prefix_share})",
        ),
        (
            "engine step time (s)",
            _num(p.step_s),
            f"t(n, p) = a + b·n + g·p = {p.step_s:.4g} + {p.per_sequence_s:.4g}·n + {p.per_prefill_token_s:.4g}·p; "
            f"c = {p.request_overhead_s:.4g} s per request outside the engine",
        ),
        (
            "engine token budget",
            limits.max_num_batched_tokens,
            f"max_num_batched_tokens per step, max_num_seqs {limits.max_num_seqs} ({limits.source}); "
            "longer bursts of prompts are chunked",
        ),
    ]
    tails = {"e2e": p.tail_e2e, "ttft": p.tail_ttft}
    shown = [n for n in (knee, knee + 1) if 1 <= n <= top]
    for n in shown:
        at = p95_at(n)
        for metric, slo in slos.items():
            verdict = "≤" if at[metric] <= slo else ">"
            steps.append(
                (
                    f"{metric} p95 at N={n} (s)",
                    _num(at[metric]),
                    f"simulated × tail {tails[metric]:.4g}; {protocol.requests(n)} requests: {protocol.text}; "
                    f"{verdict} SLO {slo:g} s",
                )
            )
    if knee >= top and top > 0:
        what = f"p95 within the SLO up to N = {top} (the ceiling): compute does not bind"
        steps.append(("compute bound", math.inf, what))
    else:
        names = " and ".join(f"{m} p95 ≤ {s:g} s" for m, s in slos.items())
        steps.append(("compute bound", knee, f"largest N with {names}" if knee else f"N = 1 already breaks {names}"))
    return steps


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else round(value, 6)
