"""The second stage of the compute-model fit: the parameters whose *simulated* runs match the measured ones.

The linear fit (cluster/capacity/compute_fit.py) matches the steady-state closed forms; the runs measured
by `bench calibrate` start with a burst, and long prompts are chunked over the engine's token
budget, which the closed forms leave out. This stage starts from the linear parameters θ0 and
minimises, over θ = (c, a, b, g) ≥ 0, the mean over the measured levels of

    ((E2E_sim − E2E) / E2E)² + w · ((TTFT_sim − TTFT) / TTFT)²

where E2E_sim and TTFT_sim are the means of the engine simulation (cluster/capacity/engine_sim.py) of the
level's own closed loop (its concurrency and its number of requests). The simulation is piecewise
in θ (a chunk boundary moves a request into another step), so the search is derivative-free:
Nelder–Mead on the four parameters scaled by θ0, with a fixed number of iterations. Deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cluster.capacity.compute_model import PerfParams, Workload
from cluster.capacity.engine_sim import EngineLimits, Simulated, simulate

TTFT_WEIGHT = 0.25  # TTFT means are short and noisier than E2E's
ITERATIONS = 240


@dataclass(frozen=True)
class Level:
    """One measured level: the closed loop that ran and the means it measured."""

    concurrency: int
    requests: int
    workload: Workload
    e2e_s: float
    ttft_s: float


def simulate_level(theta: Sequence[float], level: Level, limits: EngineLimits) -> Simulated:
    params = PerfParams(*theta)
    return simulate(params, level.workload, limits, level.concurrency, max(1, level.requests))


def loss(theta: Sequence[float], levels: Sequence[Level], limits: EngineLimits) -> float:
    """The mean squared relative error of the simulated means (see the module docstring)."""
    if any(t < 0 for t in theta) or theta[2] + theta[3] <= 0:
        return float("inf")
    total = 0.0
    for level in levels:
        run = simulate_level(theta, level, limits)
        total += ((run.mean_e2e_s - level.e2e_s) / level.e2e_s) ** 2
        total += TTFT_WEIGHT * ((run.mean_ttft_s - level.ttft_s) / level.ttft_s) ** 2
    return total / len(levels)


def refine(start: Sequence[float], levels: Sequence[Level], limits: EngineLimits) -> tuple[list[float], float]:
    """θ minimising `loss` from `start`, and its loss; `start` when nothing does better."""
    scale = [max(abs(t), 1e-6) for t in start]

    def scaled(x: Sequence[float]) -> float:
        return loss([xi * si for xi, si in zip(x, scale, strict=True)], levels, limits)

    best, value = nelder_mead(scaled, [1.0] * len(start), step=0.2, iterations=ITERATIONS)
    return [b * s for b, s in zip(best, scale, strict=True)], value


def nelder_mead(
    f: Callable[[list[float]], float], x0: list[float], *, step: float, iterations: int
) -> tuple[list[float], float]:
    """The textbook simplex search (reflect 1, expand 2, contract ½, shrink ½); the best point and value."""
    n = len(x0)
    points = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    values = [f(p) for p in points]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=lambda i: values[i])
        points, values = [points[i] for i in order], [values[i] for i in order]
        centre = [sum(p[j] for p in points[:-1]) / n for j in range(n)]
        worst = points[-1]
        reflected = _toward(centre, worst, -1.0)
        fr = f(reflected)
        if fr < values[0]:
            expanded = _toward(centre, worst, -2.0)
            fe = f(expanded)
            points[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            points[-1], values[-1] = reflected, fr
        else:
            contracted = _toward(centre, worst, 0.5)
            fc = f(contracted)
            if fc < values[-1]:
                points[-1], values[-1] = contracted, fc
            else:
                for i in range(1, n + 1):
                    points[i] = [b + 0.5 * (p - b) for b, p in zip(points[0], points[i], strict=True)]
                    values[i] = f(points[i])
    best = min(range(n + 1), key=lambda i: values[i])
    return points[best], values[best]


def _toward(centre: list[float], worst: list[float], factor: float) -> list[float]:
    """centre + factor · (worst − centre): −1 reflects, −2 expands, ½ contracts."""
    return [c + factor * (w - c) for c, w in zip(centre, worst, strict=True)]
