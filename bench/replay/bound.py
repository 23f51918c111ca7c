"""An offline lower bound on the cloud share any scheduler needs to meet the SLO on a replayed trace.

Clairvoyant (it knows every arrival and size in advance) and optimistic about the local engine, so no policy can
need fewer cloud requests than it says. From the fitted step model (cluster/capacity/compute_model.py:
t(n, p) = a + b·n + g·p):

1. **Alone it is too slow.** A request needs at least O steps one after the other, one of which prefills its
   prompt, each at least a + b: c + O·(a + b) + g·P_u > SLO means it can only meet the SLO in the cloud.
2. **Together they do not fit.** A request costs the engine its marginal work w = b·O + g·P_u, and an engine
   that serves requests of up to O_max output tokens runs at least O_max steps, each costing at least a. Every
   request kept local that arrives in a window [s, t) and is due by its end (arrival + SLO ≤ t) must be processed
   inside it, so a·O_max + Σ w ≤ (t − s) × replicas. Where a window holds more, at least some of its requests must
   leave: the fewest, found exactly (for each O_max the window could keep, the longer ones leave, then the largest
   works until the rest fits; the best of those) for windows of up to `EXACT` requests, and with the step term
   left out (the largest works first) for larger ones.
3. **Windows add up.** Windows that share no request need their evictions each: the bound takes the set of
   request-disjoint windows that asks the most in all (weighted interval scheduling over the windows).

The bound is the requests of (1) plus (3) — a necessary condition, so a lower bound; a scheduler that meets the
SLO with exactly this many is not promised. P_u counts only the prompt blocks (`hash_ids`) no earlier request of
the trace had: a perfect prefix cache, again the optimistic side. The tail factors are left out (they only raise
the cost). O(n²) windows: seconds for a few hundred requests, minutes for a few thousand.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass
from typing import Any

from bench.replay.scaling import ScaledRequest


@dataclass(frozen=True)
class StepTerms:
    request_overhead_s: float  # c
    step_s: float  # a
    per_sequence_s: float  # b
    per_prefill_token_s: float  # g


@dataclass(frozen=True)
class CloudBound:
    requests: int  # at least this many must go to the cloud
    share: float
    alone: int  # of which too slow even alone
    window: tuple[float, float] | None  # the window that asked the most (replay seconds)
    method: str = ""
    clairvoyant: dict[str, Any] | None = None  # a schedule that meets the SLO (bench/replay/clairvoyant.py)

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "share": self.share,
            "too_slow_alone": self.alone,
            "window": list(self.window) if self.window else None,
            "method": self.method,
            "clairvoyant": self.clairvoyant,
        }


def unshared_prompts(requests: tuple[ScaledRequest, ...]) -> list[float]:
    """Each request's prompt tokens not held by an earlier request's blocks (all of them without blocks)."""
    seen: set[int] = set()
    out = []
    for r in requests:
        if r.block_words is None or not r.hash_ids:
            out.append(float(r.input_tokens))
            continue
        shared, covered = 0, 0
        for block in r.hash_ids:
            size = min(r.block_words, r.input_tokens - covered)
            if size <= 0:
                break
            shared += size if block in seen else 0
            covered += size
        seen.update(r.hash_ids)
        out.append(float(max(1, r.input_tokens - shared)))
    return out


EXACT = 48  # windows of up to this many requests get the exact fewest evictions with the step term


def cloud_bound(requests: tuple[ScaledRequest, ...], terms: StepTerms, slo_s: float, replicas: int = 1) -> CloudBound:
    if not requests:
        return CloudBound(0, 0.0, 0, None)
    prompts = unshared_prompts(requests)
    a, b, c, g = terms.step_s, terms.per_sequence_s, terms.request_overhead_s, terms.per_prefill_token_s
    alone = [c + r.output_tokens * (a + b) + g * p > slo_s for r, p in zip(requests, prompts, strict=True)]
    kept = sorted(
        (r.arrival_s, r.output_tokens, b * r.output_tokens + g * p)
        for r, p, slow in zip(requests, prompts, alone, strict=True)
        if not slow
    )
    windows: list[tuple[int, int, int]] = []  # (first, last, evictions) over kept's indices
    for i, (start, _, _) in enumerate(kept):
        largest: list[float] = []  # the window's works, negated, ascending (largest first)
        total = 0.0
        for j in range(i, len(kept)):
            arrival, _, work = kept[j]
            insort(largest, -work)
            total += work
            room = (arrival + slo_s - start) * replicas  # the window [start, arrival + SLO) holds kept[i..j]
            if j - i < EXACT:
                need = _fewest(kept[i : j + 1], room, a)
            else:
                need = _largest_first(largest, total - room)
            if need:
                windows.append((i, j, need))
    window = None
    if windows:
        first, last, _ = max(windows, key=lambda w: w[2])
        window = (kept[first][0], kept[last][0] + slo_s)
    total_count = sum(alone) + _disjoint(windows, len(kept))
    return CloudBound(total_count, total_count / len(requests), sum(alone), window, METHOD)


METHOD = (
    "windows [arrival, deadline]: a·O_max + Σ(b·O + g·P_u) ≤ length × replicas, request-disjoint windows summed, "
    "perfect prefix cache"
)


def _largest_first(negated_works: list[float], excess: float) -> int:
    removed = 0
    while excess > 1e-12 and removed < len(negated_works):
        excess += negated_works[removed]
        removed += 1
    return removed


def _fewest(items: list[tuple[float, int, float]], room: float, a: float) -> int:
    """The fewest of `items` (arrival, output tokens, work) to remove so that a·O_max + Σ work ≤ room."""
    by_work = sorted(items, key=lambda item: -item[2])
    best = len(items)
    for cap in sorted({o for _, o, _ in items}, reverse=True):
        forced = sum(1 for _, o, _ in items if o > cap)
        if forced >= best:
            break
        total = sum(w for _, o, w in items if o <= cap)
        excess, removed = total + a * cap - room, 0
        for _, o, w in by_work:
            if excess <= 1e-12:
                break
            if o <= cap:
                excess -= w
                removed += 1
        if excess <= 1e-12:  # else even removing every request up to `cap` leaves a·cap > room: fewer caps next
            best = min(best, forced + removed)
    return best


def _disjoint(windows: list[tuple[int, int, int]], count: int) -> int:
    """The most evictions a set of request-disjoint windows (first, last, evictions) asks for in all."""
    ending: list[list[tuple[int, int, int]]] = [[] for _ in range(count)]
    for window in windows:
        ending[window[1]].append(window)
    best = [0] * (count + 1)  # best[k]: over windows within kept[0..k-1]
    for k in range(1, count + 1):
        best[k] = max([best[k - 1], *(need + best[first] for first, _, need in ending[k - 1])])
    return best[count]
