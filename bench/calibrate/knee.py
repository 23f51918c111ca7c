"""The knee of a concurrency sweep, and how it compares with the capacity formula.

A level (`LoadPoint`) is acceptable when all three hold:

    latency      p95 ≤ SLO                          (a level with no successful request has no p95: fails)
    errors       error rate ≤ max_error_rate        (1% by default; a saturated server answers 429/503
                                                     fast, so errors are watched with latency)
    throughput   throughput ≥ 95% × plateau

The plateau is the highest throughput observed over the levels that meet the SLO and the error
limit (over all levels when none does). Levels that break the SLO or fail requests do not set it:
otherwise a sweep whose throughput still grows past the SLO (common: batching raises throughput
and latency together) would have no knee, and a fast flood of 429s could look like throughput.

The knee is the largest acceptable concurrency. `Knee.bound` says what stopped it: the first
condition (latency, errors, throughput, in that order) that the next level above the knee fails,
or "sweep_end" when the knee is the highest level tested (raise the sweep to see it break).
When no level is acceptable the knee is None, `bound` is "none" and `explanation` says why.

`compare_with_formula` puts the measured knee beside the formula's admission limit: a relative
difference above 15% means the formula's assumptions do not hold for this workload and machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

Bound = Literal["latency", "errors", "throughput", "sweep_end", "none"]
DEFAULT_PLATEAU_FRACTION = 0.95
DEFAULT_MAX_ERROR_RATE = 0.01
DEFAULT_TOLERANCE = 0.15


@dataclass(frozen=True)
class LoadPoint:
    concurrency: int
    throughput_rps: float
    p95_s: float | None
    error_rate: float = 0.0


@dataclass(frozen=True)
class Knee:
    concurrency: int | None
    bound: Bound
    explanation: str
    plateau_rps: float
    slo_p95_s: float
    point: LoadPoint | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def find_knee(
    points: Sequence[LoadPoint],
    slo_p95_s: float,
    *,
    plateau_fraction: float = DEFAULT_PLATEAU_FRACTION,
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
) -> Knee:
    """The largest concurrency that meets the SLO, the error limit and ≥ plateau_fraction of the plateau."""
    if slo_p95_s <= 0:
        raise ValueError(f"the SLO must be > 0 s, got {slo_p95_s}")
    if not 0 < plateau_fraction <= 1:
        raise ValueError(f"plateau_fraction must be in (0, 1], got {plateau_fraction}")
    ordered = sorted(points, key=lambda p: p.concurrency)
    if not ordered:
        return Knee(None, "none", "no levels were measured", 0.0, slo_p95_s)
    healthy = [
        p for p in ordered if p.error_rate <= max_error_rate and p.p95_s is not None and p.p95_s <= slo_p95_s
    ] or ordered
    plateau = max(p.throughput_rps for p in healthy)
    floor = plateau_fraction * plateau

    def failures(p: LoadPoint) -> list[tuple[Bound, str]]:
        found: list[tuple[Bound, str]] = []
        if p.p95_s is None:
            found.append(("latency", f"no request succeeded at concurrency {p.concurrency}"))
        elif p.p95_s > slo_p95_s:
            found.append(("latency", f"p95 {p.p95_s:.3g} s > SLO {slo_p95_s:g} s at concurrency {p.concurrency}"))
        if p.error_rate > max_error_rate:
            found.append(
                ("errors", f"error rate {p.error_rate:.1%} > {max_error_rate:.1%} at concurrency {p.concurrency}")
            )
        if p.throughput_rps < floor:
            found.append(
                (
                    "throughput",
                    f"throughput {p.throughput_rps:.3g} req/s < {plateau_fraction:.0%} of the plateau "
                    f"{plateau:.3g} req/s at concurrency {p.concurrency}",
                )
            )
        return found

    good = [p for p in ordered if not failures(p)]
    if not good:
        return Knee(None, "none", _no_knee_reason(ordered, slo_p95_s, max_error_rate, failures), plateau, slo_p95_s)
    knee = good[-1]
    above = [p for p in ordered if p.concurrency > knee.concurrency]
    p95_text = f"p95 {knee.p95_s:.3g} s" if knee.p95_s is not None else "no p95"
    head = (
        f"knee at concurrency {knee.concurrency}: {p95_text} ≤ SLO {slo_p95_s:g} s, "
        f"{knee.throughput_rps:.3g} req/s ≥ {plateau_fraction:.0%} of the plateau {plateau:.3g} req/s, "
        f"error rate {knee.error_rate:.1%}"
    )
    if not above:
        return Knee(
            knee.concurrency,
            "sweep_end",
            f"{head}; it is the highest level tested: raise the sweep to find where it breaks",
            plateau,
            slo_p95_s,
            knee,
        )
    bound, why = failures(above[0])[0]
    return Knee(knee.concurrency, bound, f"{head}; the next level breaks it: {why}", plateau, slo_p95_s, knee)


def _no_knee_reason(points: list[LoadPoint], slo: float, max_error_rate: float, failures: Any) -> str:
    with_p95 = [p for p in points if p.p95_s is not None]
    if not with_p95:
        return "no level had a successful request"
    if all(p.p95_s is not None and p.p95_s > slo for p in points):
        best = min(with_p95, key=lambda p: p.p95_s or 0.0)
        return (
            f"no level met the SLO: the lowest p95 was {best.p95_s:.3g} s at concurrency {best.concurrency} > {slo:g} s"
        )
    if all(p.error_rate > max_error_rate for p in points):
        best = min(points, key=lambda p: p.error_rate)
        return (
            f"every level had errors: the lowest error rate was {best.error_rate:.1%} at concurrency "
            f"{best.concurrency} > {max_error_rate:.1%}"
        )
    return "no level met all conditions: " + "; ".join(why for p in points for _, why in failures(p)[:1])


@dataclass(frozen=True)
class FormulaComparison:
    measured: int | None
    predicted: int | None
    relative_diff: float | None
    exceeds: bool
    sentence: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_with_formula(
    knee: int | None,
    predicted_limit: int | None,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    knee_bound: Bound | None = None,
) -> FormulaComparison:
    """relative diff = (knee − predicted) / predicted; `exceeds` when |diff| > tolerance (15%).

    `knee_bound` (the knee's `bound`) sharpens the sentence: a knee at the end of the sweep is a
    lower bound of the real one, not evidence that the replica breaks there.
    """
    if knee is None or predicted_limit is None or predicted_limit <= 0:
        missing = "no knee was measured" if knee is None else "the formula gave no admission limit"
        return FormulaComparison(knee, predicted_limit, None, False, f"No comparison: {missing}.")
    diff = (knee - predicted_limit) / predicted_limit
    exceeds = abs(diff) > tolerance
    where = (
        f"The measured knee ({knee}) is {abs(diff):.0%} {'below' if diff < 0 else 'above'} the formula's "
        f"admission limit ({predicted_limit}), more than {tolerance:.0%}"
    )
    if not exceeds:
        sentence = (
            f"The measured knee ({knee}) is within {tolerance:.0%} of the formula's admission limit "
            f"({predicted_limit}, {diff:+.0%}): the KV-memory formula holds for this workload."
        )
    elif diff < 0 and knee_bound == "sweep_end":
        sentence = (
            f"{where}, but the knee is the highest level tested: the sweep never reached the point where the "
            "replica breaks, so raise the levels before trusting either number."
        )
    elif diff < 0:
        sentence = (
            f"{where}: the replica breaks (latency, errors or throughput) before its KV cache fills, so it is "
            "compute/throughput-bound and the measured knee, not the memory formula, should set admission_limit."
        )
    else:
        sentence = (
            f"{where}: the replica holds more than the formula's worst case (outputs shorter than max_tokens, "
            "prefix-cache sharing, the 80% safety fraction), so the measured knee can raise admission_limit "
            "while p95 stays in the SLO."
        )
    return FormulaComparison(knee, predicted_limit, diff, exceeds, sentence)


def binding_bound(knee: Knee, predicted_kv_limit: int | None) -> str:
    """Which bound binds: "memory" when the KV limit ≤ the knee, else "compute/throughput".

    "undetermined" when there is no knee, no prediction, or the sweep ended below the KV limit
    without breaking (nothing was seen to bind yet).
    """
    if knee.concurrency is None or predicted_kv_limit is None:
        return "undetermined"
    if predicted_kv_limit <= knee.concurrency:
        return "memory"
    if knee.bound == "sweep_end":
        return "undetermined"
    return "compute/throughput"
