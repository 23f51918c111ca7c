"""Routing by the health score's weight: the share of new requests a degraded first choice keeps.

    the first candidate, with weight W (0..100) in the request's scenario, keeps W% of the
    requests it is ranked first for when another candidate could take them; each of the others
    goes to the next candidate instead, and the demoted one stays right behind it as its fallback

The weight follows the live health score by at most `max_step` points per `min_interval_s`
(router/resilience/health_score.py), so the share a target loses or regains moves by at most that much per
interval. Weight 100 (no live evidence yet, or a healthy target) changes nothing: today's order, and
so does any weight of 90 or more — the score's cost part is at most 10 points, and a healthy target that
is merely dearer than another must not shed traffic (the ranking already prefers the cheaper one).
A local model first in line is never weighed: its latency grows with its load and with the sizes of
the requests it serves by design, and its routing already follows its saturation, watermarks and
health (router/routing/saturation.py, router/resilience/health.py); the weight moves traffic between cloud targets.
Only the first candidate is weighed: the rest of the order is the pipeline's (and the breakers',
health's and a graded switch's, which act on the order this returns). The split is deterministic,
like a graded switch's (`router.traffic.migration.splitter`): exactly (100 - W) in every 100 requests move.
Pure: the caller keeps the per-target count and passes it in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from router.routing.capabilities import is_local_id
from router.traffic.migration import splitter

T = TypeVar("T")
FULL = 100.0
HEALTHY = 90.0  # a weight at or above this keeps all its requests: cost alone (10 points) never sheds


@dataclass(frozen=True)
class Weighed:
    moved: bool  # this request goes to the next candidate
    weighed: bool  # the first candidate's weight was below 100 and it had an alternative
    note: str  # for the decision record's `traffic` and `x-spillover-traffic`; "" when not weighed


def kept_share(weight: float) -> float:
    """The share of its requests a target with this weight keeps (0..1)."""
    return min(FULL, max(0.0, weight)) / FULL


def weigh(first: str, weight: float, score: float, count: int, *, alternative: str | None) -> Weighed:
    """Whether the `count`-th (0-based) request ranked first at `first` moves to `alternative`."""
    if alternative is None or weight >= HEALTHY or is_local_id(first):
        return Weighed(False, False, "")
    moved = splitter(1.0 - kept_share(weight), count)
    said = f"weight: {first} {weight:.0f} (score {score:.0f}) keeps {kept_share(weight):.0%}"
    return Weighed(moved, True, said + (f": moved to {alternative}" if moved else ": kept"))


def reordered(candidates: Sequence[tuple[T, str]], reason: str) -> list[tuple[T, str]]:
    """The first two candidates swapped; the promoted one carries `reason` (the record's reason)."""
    out = list(candidates)
    if len(out) < 2:
        return out
    (first, _), (second, _) = out[0], out[1]
    return [(second, reason), (first, ""), *out[2:]]
