"""The fit of the compute model's parameters (cluster/capacity/compute_model.py) from measured runs, in two stages.

Stage 1, linear. Each measured level (`FitPoint`: concurrency N, mean prompt tokens P, prefix-cache share s, mean
output tokens O, and the mean TTFT, TPOT and E2E of its requests) gives equations that are linear
in θ = (c, a, b, g), with P_u = P·(1 − s):

    E2E:   c + O·a + b·N·O + g·N·P_u          = mean E2E     (every level)
    TTFT:  c + a + b + g·P_u                  = mean TTFT    (N = 1 only)
    TPOT:      a + b                          = mean TPOT    (N = 1 only)

E2E is Little's law and holds however the N requests interleave; TTFT and TPOT at N > 1 depend on
how the other requests' prefills fall into a request's steps (together at first, spread out later:
measured TPOT at N > 1 lies between a + b·N and a + b·N + g·N·P_u / O), so only N = 1 is used.

Every row is divided by its measured value, so the fit minimises the sum of squared *relative*
errors (a 10 s E2E does not drown a 50 ms TPOT). The times cannot be negative: the fit is the
non-negative least-squares optimum, found exactly by solving the unconstrained problem on every
subset of the four parameters (the others held at 0) and keeping the best feasible solution —
the NNLS optimum is one of those 16. A design needs at least two concurrency levels, and two
output lengths or prompt lengths, for the four parameters to be determined.

Stage 2, simulated (cluster/capacity/compute_refine.py): from the linear θ, the parameters whose engine
simulations (cluster/capacity/engine_sim.py: token budget, chunked prefill, the level's own closed loop with
its burst start) best match the measured means. The residuals reported are the simulation's.

The tails are the medians over the points of measured p95 / simulated p95 (at least 1).
Pure: no I/O, no clock; floats with Gaussian elimination on a 4 × 4 system, then Nelder–Mead.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cluster.capacity.compute_model import PerfParams, Workload
from cluster.capacity.compute_refine import Level, refine, simulate_level
from cluster.capacity.engine_sim import EngineLimits

NAMES = ("request_overhead_s", "step_s", "per_sequence_s", "per_prefill_token_s")


class FitError(ValueError):
    """The points cannot determine the parameters; the message says what the design lacks."""


@dataclass(frozen=True)
class FitPoint:
    concurrency: int
    prompt_tokens: float
    output_tokens: float
    ttft_s: float
    tpot_s: float | None
    e2e_s: float
    cached_share: float = 0.0
    ttft_p95_s: float | None = None
    e2e_p95_s: float | None = None
    label: str = ""
    requests: int = 0  # measured requests of the level's closed loop; 0: one wave (= concurrency)

    @property
    def prefill_tokens(self) -> float:
        return self.prompt_tokens * (1 - self.cached_share)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Residual:
    point: FitPoint
    ttft_s: float
    tpot_s: float
    e2e_s: float
    e2e_p95_s: float
    ttft_p95_s: float

    @property
    def e2e_error(self) -> float:
        return (self.e2e_s - self.point.e2e_s) / self.point.e2e_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "point": self.point.to_dict(),
            "predicted": {
                "ttft_s": self.ttft_s,
                "tpot_s": self.tpot_s,
                "e2e_s": self.e2e_s,
                "e2e_p95_s": self.e2e_p95_s,
                "ttft_p95_s": self.ttft_p95_s,
            },
            "e2e_error": self.e2e_error,
        }


@dataclass(frozen=True)
class FitResult:
    params: PerfParams
    residuals: tuple[Residual, ...]
    rms_relative_error: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": self.params.to_dict(),
            "rms_relative_error": self.rms_relative_error,
            "points": [r.to_dict() for r in self.residuals],
        }


def rows(point: FitPoint) -> list[tuple[list[float], float]]:
    """The point's equations: (coefficients of c, a, b, g; measured value). E2E at every level; TTFT and
    TPOT only at concurrency 1, where no other request's prefill can fall into the request's steps."""
    n, out, pu = float(point.concurrency), point.output_tokens, point.prefill_tokens
    found = [([1.0, out, n * out, n * pu], point.e2e_s)]
    if point.concurrency == 1:
        found.append(([1.0, 1.0, 1.0, pu], point.ttft_s))
        if point.tpot_s is not None:
            found.append(([0.0, 1.0, 1.0, 0.0], point.tpot_s))
    return found


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    size = len(vector)
    m = [[*row, vector[i]] for i, row in enumerate(matrix)]
    scale = max((abs(v) for row in matrix for v in row), default=0.0) or 1.0
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) <= 1e-12 * scale:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, size):
            f = m[r][col] / m[col][col]
            for k in range(col, size + 1):
                m[r][k] -= f * m[col][k]
    x = [0.0] * size
    for r in reversed(range(size)):
        x[r] = (m[r][size] - sum(m[r][k] * x[k] for k in range(r + 1, size))) / m[r][r]
    return x


def _least_squares(weighted: list[tuple[list[float], float]], free: tuple[int, ...]) -> list[float] | None:
    normal = [[sum(row[i] * row[j] for row, _ in weighted) for j in free] for i in free]
    rhs = [sum(row[i] * y for row, y in weighted) for i in free]
    solved = _solve(normal, rhs)
    if solved is None:
        return None
    theta = [0.0] * len(NAMES)
    for index, value in zip(free, solved, strict=True):
        theta[index] = value
    return theta


def _cost(weighted: list[tuple[list[float], float]], theta: list[float]) -> float:
    return sum((sum(c * t for c, t in zip(row, theta, strict=True)) - y) ** 2 for row, y in weighted)


def fit(points: Sequence[FitPoint], limits: EngineLimits | None = None) -> FitResult:
    """Linear, then simulated (see the module docstring): the parameters, the tails, and each point's
    simulated vs measured."""
    limits = limits or EngineLimits()
    usable = [p for p in points if p.e2e_s > 0 and p.ttft_s > 0 and p.output_tokens >= 1]
    if len({p.concurrency for p in usable}) < 2:
        raise FitError("the fit needs measured levels at two or more concurrencies")
    start = linear_fit(usable)
    levels = [_level(p) for p in usable]
    theta, _ = refine(start, levels, limits)
    runs = [simulate_level(theta, level, limits) for level in levels]
    residuals = []
    for p, run in zip(usable, runs, strict=True):
        tpot = (run.mean_e2e_s - run.mean_ttft_s) / (p.output_tokens - 1) if p.output_tokens > 1 else 0.0
        residuals.append(Residual(p, run.mean_ttft_s, tpot, run.mean_e2e_s, run.p95_s("e2e"), run.p95_s("ttft")))
    c, a, b, g = theta
    params = PerfParams(c, a, b, g, tail_e2e=_tail(residuals, "e2e"), tail_ttft=_tail(residuals, "ttft"))
    rms = math.sqrt(statistics.fmean(r.e2e_error**2 for r in residuals))
    return FitResult(params, tuple(residuals), rms)


def linear_fit(usable: Sequence[FitPoint]) -> list[float]:
    """Stage 1: the non-negative least-squares θ of the steady-state equations."""
    weighted = [([c / y for c in row], 1.0) for p in usable for row, y in rows(p) if y > 0]
    best: tuple[float, list[float]] | None = None
    for size in range(len(NAMES), 0, -1):
        for free in itertools.combinations(range(len(NAMES)), size):
            theta = _least_squares(weighted, free)
            if theta is None or any(t < 0 for t in theta):
                continue
            cost = _cost(weighted, theta)
            if best is None or cost < best[0] - 1e-15:
                best = (cost, theta)
    if best is None or best[1][2] + best[1][3] <= 0:
        raise FitError("the measured latencies do not grow with concurrency: no compute bound can be fitted")
    return best[1]


def _level(p: FitPoint) -> Level:
    workload = Workload(p.prompt_tokens, p.output_tokens, min(p.cached_share, 0.999))
    return Level(p.concurrency, p.requests or p.concurrency, workload, p.e2e_s, p.ttft_s)


def _tail(residuals: Sequence[Residual], metric: str) -> float:
    ratios = []
    for r in residuals:
        measured, predicted = (
            (r.point.e2e_p95_s, r.e2e_p95_s) if metric == "e2e" else (r.point.ttft_p95_s, r.ttft_p95_s)
        )
        if measured is not None and predicted > 0:
            ratios.append(measured / predicted)
    return max(1.0, statistics.median(ratios)) if ratios else 1.0
