"""An offline lower bound on the cloud share any scheduler needs to meet the SLO on a replayed trace.

Clairvoyant (it knows every arrival and size in advance) and optimistic about the local engine, so no policy can
need fewer cloud requests than it says. From the fitted step model (cluster/capacity/compute_model.py:
t(n, p) = a + b·n + g·p):

1. **Alone it is too slow.** A request needs at least O steps one after the other, one of which prefills its
   prompt, each at least a + b: c + O·(a + b) + g·P_u > SLO means it can only meet the SLO in the cloud.
2. **Together they do not fit.** However large the batch, a request costs the engine at least its marginal work
   w = b·O + g·P_u (a step's fixed a shared among infinitely many sequences). Every request kept local that
   arrives in a window [s, t) and is due by its end (arrival + SLO ≤ t) must be processed inside it, so
   Σ w ≤ (t − s) × replicas. Where a window holds more, at least enough of its requests must leave to bring its
   sum under: the fewest, taking the largest first.

The bound is the requests of (1) plus the largest count (2) asks of any single window (windows start at an
arrival and end at a deadline) — a necessary condition, so a lower bound; a scheduler that meets the SLO with
exactly this many is not promised. P_u counts only the prompt blocks (`hash_ids`) no earlier request of the
trace had: a perfect prefix cache, again the optimistic side. The tail factors are left out (they only raise the
cost). O(n²) windows, each grown by one request (an insertion into its sorted works): seconds for a few hundred
requests, minutes for a few thousand.
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
    method: str = "fluid: b·O + g·P_u per request, windows [arrival, deadline], perfect prefix cache"

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "share": self.share,
            "too_slow_alone": self.alone,
            "window": list(self.window) if self.window else None,
            "method": self.method,
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


def cloud_bound(requests: tuple[ScaledRequest, ...], terms: StepTerms, slo_s: float, replicas: int = 1) -> CloudBound:
    if not requests:
        return CloudBound(0, 0.0, 0, None)
    prompts = unshared_prompts(requests)
    a, b, c, g = terms.step_s, terms.per_sequence_s, terms.request_overhead_s, terms.per_prefill_token_s
    alone = [c + r.output_tokens * (a + b) + g * p > slo_s for r, p in zip(requests, prompts, strict=True)]
    kept = [
        (r.arrival_s, b * r.output_tokens + g * p)
        for r, p, slow in zip(requests, prompts, alone, strict=True)
        if not slow
    ]
    kept.sort()
    best, window = 0, None
    for i, (start, _) in enumerate(kept):
        largest: list[float] = []  # the window's works, negated, ascending (largest first)
        total = 0.0
        for arrival, work in kept[i:]:
            insort(largest, -work)
            total += work
            end = arrival + slo_s  # the window [start, end) holds every kept request from start to this one
            excess, removed = total - (end - start) * replicas, 0
            while excess > 1e-12 and removed < len(largest):
                excess += largest[removed]
                removed += 1
            if removed > best:
                best, window = removed, (start, end)
    total = sum(alone) + best
    return CloudBound(total, total / len(requests), sum(alone), window)
