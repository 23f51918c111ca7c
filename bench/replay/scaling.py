"""Fit a production trace to a small box, seeded and documented: which requests, when, and how long.

Applied in this order (`scale_trace`), every step optional:

    spread    timestamps quantised to buckets (Mooncake's ~3 s): the requests of one timestamp are spread
              uniformly over [t, t + spread_s), capped at the next timestamp so buckets never overlap; within
              a bucket the drawn offsets are sorted and handed out in file order, so no request moves ahead
              of one listed before it
    window    `window_s` seconds of the (spread) trace: from `window_at` seconds, or the busiest window (the
              most arrivals in `window_s`); the window's start becomes 0
    thin      keep each request with probability `keep` (rate × keep, same shape; seeded)
    stretch   multiply every arrival time by `stretch` (> 1 slows the trace down, < 1 speeds it up): the
              rate scales by 1 / stretch, the order never changes
    tokens    prompt × `input_scale`, output × `output_scale` (rounded, at least 1), then capped: output at
              `max_output`, prompt at `max_input` and at `context_window` − output (the model's window);
              a prompt's 512-token blocks become `block_tokens` × `input_scale` words, so requests that shared
              a prefix in the trace share one here (bench/replay/prompts.py)
    count     at most `max_requests` (the first ones)

Nothing is ever reordered: a replay keeps the trace's burst shape, only its rate and sizes change.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from bench.replay.traces import Trace, TraceError, TraceRequest

BUSIEST = "busiest"


@dataclass(frozen=True)
class Scaling:
    spread_s: float = 0.0
    window_s: float | None = None
    window_at: float | str = BUSIEST
    keep: float = 1.0
    stretch: float = 1.0
    input_scale: float = 1.0
    output_scale: float = 1.0
    max_input: int | None = None
    max_output: int | None = None
    context_window: int = 4096
    max_requests: int | None = None
    seed: int = 0

    def check(self) -> None:
        problems = []
        if not (math.isfinite(self.spread_s) and self.spread_s >= 0):
            problems.append("--spread-s must be >= 0")
        if self.window_s is not None and not (math.isfinite(self.window_s) and self.window_s > 0):
            problems.append("--window-s must be > 0")
        if self.window_at != BUSIEST and not (
            isinstance(self.window_at, float | int) and math.isfinite(self.window_at) and self.window_at >= 0
        ):
            problems.append("--window-at must be 'busiest' or a number of seconds >= 0")
        if not (0 < self.keep <= 1):
            problems.append("--keep must be in (0, 1]")
        for name in ("stretch", "input_scale", "output_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= 1e6):
                problems.append(f"--{name.replace('_', '-')} must be > 0")
        for name in ("max_input", "max_output", "max_requests"):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1")
        if self.context_window < 2:
            problems.append("--context-window must be >= 2")
        if problems:
            raise TraceError("; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ScaledRequest:
    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    block_words: int | None  # words per shared block (None: no blocks in this format)
    trace_line: int
    trace_input_tokens: int
    trace_output_tokens: int


@dataclass(frozen=True)
class ScaledTrace:
    requests: tuple[ScaledRequest, ...]
    window_start_s: float  # in the trace's clock (after spreading)
    window_s: float  # in the replay's clock (after stretching)
    scaling: Scaling
    capped: int  # prompts cut by the caps

    @property
    def rate_rps(self) -> float:
        return len(self.requests) / self.window_s if self.window_s > 0 else 0.0


def scale_trace(trace: Trace, scaling: Scaling) -> ScaledTrace:
    """The requests to replay (see the module docstring); raises `TraceError` when nothing is left."""
    scaling.check()
    rng = random.Random(f"{scaling.seed}:replay")
    times = spread(trace.requests, scaling.spread_s, rng)
    start, end = window(times, scaling.window_s, scaling.window_at, trace.duration_s + scaling.spread_s)
    picked = [(t, r) for t, r in zip(times, trace.requests, strict=True) if start <= t < end]
    thin_rng = random.Random(f"{scaling.seed}:thin")
    picked = [(t, r) for t, r in picked if scaling.keep >= 1 or thin_rng.random() < scaling.keep]
    if scaling.max_requests is not None:
        picked = picked[: scaling.max_requests]
    if not picked:
        raise TraceError(f"no request left in the window [{start:g}, {end:g}) s after thinning")
    block_words = None
    if trace.block_tokens is not None:
        block_words = max(1, round(trace.block_tokens * scaling.input_scale))
    scaled, capped = [], 0
    for t, r in picked:
        output = max(1, round(r.output_tokens * scaling.output_scale))
        if scaling.max_output is not None:
            output = min(output, scaling.max_output)
        output = min(output, scaling.context_window - 1)
        prompt = max(1, round(r.input_tokens * scaling.input_scale))
        cap = scaling.context_window - output
        if scaling.max_input is not None:
            cap = min(cap, scaling.max_input)
        capped += prompt > cap
        scaled.append(
            ScaledRequest(
                (t - start) * scaling.stretch,
                min(prompt, cap),
                output,
                r.hash_ids,
                block_words,
                r.line,
                r.input_tokens,
                r.output_tokens,
            )
        )
    length = (end - start) if math.isfinite(end) else (picked[-1][0] - start)
    return ScaledTrace(tuple(scaled), start, max(length, 1e-9) * scaling.stretch, scaling, capped)


def spread(requests: tuple[TraceRequest, ...], spread_s: float, rng: random.Random) -> list[float]:
    """Arrival times with each group of equal timestamps spread over [t, min(t + spread_s, next t))."""
    times = [r.arrival_s for r in requests]
    if spread_s <= 0:
        return times
    out: list[float] = []
    i = 0
    while i < len(times):
        j = i
        while j < len(times) and times[j] == times[i]:
            j += 1
        width = spread_s if j == len(times) else min(spread_s, times[j] - times[i])
        offsets = sorted(rng.random() * width for _ in range(j - i))
        out.extend(times[i] + o for o in offsets)
        i = j
    return out


def window(times: list[float], window_s: float | None, at: float | str, duration_s: float) -> tuple[float, float]:
    """[start, end) of the replayed window in the trace's clock."""
    if window_s is None:
        return (0.0, math.inf) if at == BUSIEST else (float(at), math.inf)
    if at != BUSIEST:
        start = float(at)
        if start >= duration_s:
            raise TraceError(f"--window-at {start:g} s is past the trace's end ({duration_s:g} s)")
        return start, start + window_s
    start = busiest(times, window_s)
    return start, start + window_s


def busiest(times: list[float], window_s: float) -> float:
    """The start of the `window_s`-long window holding the most arrivals (the earliest such), a window
    starting at an arrival."""
    best_count, best_start, j = 0, times[0], 0
    for i, start in enumerate(times):
        j = max(j, i)
        while j < len(times) and times[j] < start + window_s:
            j += 1
        if j - i > best_count:
            best_count, best_start = j - i, start
    return best_start
