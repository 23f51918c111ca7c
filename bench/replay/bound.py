"""An offline lower bound on the cloud share any scheduler needs to meet the SLO on a replayed trace.

Clairvoyant (it knows every arrival and size in advance) and optimistic about the local engine, so no policy can
need fewer cloud requests than it says. From the fitted step model (cluster/capacity/compute_model.py:
t(n, p) = a + b·n + g·p):

1. **Alone it is too slow.** A request needs at least O steps one after the other, one of which prefills its
   prompt, each at least a + b: c + O·(a + b) + g·P_u > SLO means it can only meet the SLO in the cloud.
2. **Together they do not fit.** Every request kept local that arrives in a window [s, t) and is due by its end
   (arrival + SLO ≤ t) is served inside it, by steps that take the window's length L × replicas R at most. Two
   necessary conditions on such a set S of m requests (T output tokens, P_u unshared prompt tokens in all):
   - *throughput*: a request costs the engine its marginal work w = b·O + g·P_u, and an engine that serves
     requests of up to O_max output tokens runs at least O_max steps, each costing at least a, so
     a·O_max + Σ w ≤ L·R;
   - *latency*: a step of n sequences takes at least a + b·n (+ g × the prompt tokens it prefills), and each
     request is in at least O steps that must all pass within its SLO, less c. Summing every request's own steps,
     a step of S's n_k sequences counts n_k times: Σ_k n_k·(a + b·n_k) + g·P_u ≤ m·(SLO − c). With Σ n_k ≥ T and
     the steps' count K ≤ (L·R − b·T − g·P_u) / a, Cauchy–Schwarz (Σ n_k² ≥ T² / K) gives
     a·T + g·P_u + a·b·T² / (L·R − b·T − g·P_u) ≤ m·(SLO − c) — Little's law for a batch whose every member
     slows the rest: W = a·O / (1 − b·λ·O) in steady state.
   Where a window's requests break either, some must leave: for the throughput condition the fewest, found exactly
   (for each O_max the window could keep, the longer ones leave, then the largest works until the rest fits; the
   best of those) for windows of up to `EXACT` requests, and with the step term left out (the largest works
   first) for larger ones; for the latency condition, whose left side only grows with T and P_u, the fewest k for
   which the m − k shortest outputs and smallest prompts (taken apart, an optimistic pairing) would pass. A
   window needs the larger of the two.
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
        (r.arrival_s, r.output_tokens, b * r.output_tokens + g * p, p)
        for r, p, slow in zip(requests, prompts, alone, strict=True)
        if not slow
    )
    windows: list[tuple[int, int, int]] = []  # (first, last, evictions) over kept's indices
    for i, (start, _, _, _) in enumerate(kept):
        largest: list[float] = []  # the window's works, negated, ascending (largest first)
        latency = _Latency(terms, slo_s)
        total = 0.0
        for j in range(i, len(kept)):
            arrival, output, work, prompt = kept[j]
            insort(largest, -work)
            latency.add(output, prompt)
            total += work
            room = (arrival + slo_s - start) * replicas  # the window [start, arrival + SLO) holds kept[i..j]
            if j - i < EXACT:
                need = _fewest([k[:3] for k in kept[i : j + 1]], room, a)
            else:
                need = _largest_first(largest, total - room)
            need = max(need, latency.fewest(room))
            if need:
                windows.append((i, j, need))
    window = None
    if windows:
        first, last, _ = max(windows, key=lambda w: w[2])
        window = (kept[first][0], kept[last][0] + slo_s)
    total_count = sum(alone) + _disjoint(windows, len(kept))
    return CloudBound(total_count, total_count / len(requests), sum(alone), window, METHOD)


METHOD = (
    "windows [arrival, deadline]: a·O_max + Σ(b·O + g·P_u) ≤ L·R and a·T + g·P_u + a·b·T²/(L·R − b·T − g·P_u) ≤ "
    "m·(SLO − c), request-disjoint windows summed, perfect prefix cache"
)


class _Latency:
    """A window's latency condition (module docstring, 2): its requests' outputs and unshared prompts, each
    kept largest first, and the fewest that must leave for the rest to pass."""

    def __init__(self, terms: StepTerms, slo_s: float) -> None:
        self.terms, self.budget = terms, slo_s - terms.request_overhead_s
        self.outputs: list[float] = []  # negated, ascending: largest first
        self.prompts: list[float] = []
        self.tokens = self.prefill = 0.0

    def add(self, output: int, prompt: float) -> None:
        insort(self.outputs, -float(output))
        insort(self.prompts, -prompt)
        self.tokens += output
        self.prefill += prompt

    def passes(self, count: int, tokens: float, prefill: float, room: float) -> bool:
        a, b, g = self.terms.step_s, self.terms.per_sequence_s, self.terms.per_prefill_token_s
        steps_room = room - b * tokens - g * prefill
        if steps_room <= 0:
            return count == 0
        return a * tokens + g * prefill + a * b * tokens * tokens / steps_room <= count * self.budget + 1e-12

    def fewest(self, room: float) -> int:
        count, tokens, prefill = len(self.outputs), self.tokens, self.prefill
        for k in range(count + 1):
            if self.passes(count - k, tokens, prefill, room):
                return k
            if k < count:
                tokens += self.outputs[k]
                prefill += self.prompts[k]
        return count


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
