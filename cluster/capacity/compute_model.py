"""The compute model: an engine step's time, fitted per model and machine, and what follows from it.

Parameters (`PerfParams`, fitted per model and machine by `bench calibrate`, cluster/capacity/compute_fit.py):

    c   request_overhead_s    time per request outside the engine's steps (HTTP, gateway, tokenizer)
    a   step_s                fixed time of one engine step
    b   per_sequence_s        added per sequence in the step
    g   per_prefill_token_s   added per prompt token prefilled in the step
    tail_e2e, tail_ttft       measured p95 / predicted p95 (the spread the step model lacks; 1 = none)

One engine step that carries n sequences and prefills p prompt tokens takes

    t(n, p) = a + b·n + g·p

A workload is a prompt of P tokens, O output tokens and a prefix share s (the part of the prompt
the prefix cache already holds, not prefilled again): P_u = P·(1 − s) tokens are prefilled.

Predictions come from running that step time through vLLM's scheduler (cluster/capacity/engine_sim.py:
token budget, chunked prefill, a closed loop that starts with a burst) and the knee from those
(cluster/capacity/compute_knee.py). In steady state, with every prompt prefilled in one step, the
simulation reduces to closed forms (`latency` below) that start the fit and explain the shape:

    TTFT(N) = c + t(N, N·P_u)       = c + a + b·N + g·N·P_u     (a cohort of N prefilled together)
    TPOT(N) = t(N, 0)               = a + b·N
    E2E(N)  = TTFT + (O − 1)·TPOT   = c + O·a + N·(O·b + P_u·g)
    X(N)    = N / E2E(N)            requests/s (Little's law; it tends to 1 / (O·b + P_u·g))

E2E holds however the N requests interleave (each step carries N sequences and on average N·P_u / O
prefill tokens); TTFT and the tail do not: they depend on how many prompts arrive together and on
the engine's token budget, which is what the simulation adds.

The admission limit is min(memory bound, compute bound) and names the one that binds (ties name
memory): the memory bound is cluster/capacity/memory.py's ⌊fraction × KV max concurrency⌋.
Pure and exact: decimal inputs become fractions, so hand-checked numbers stay exact.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any, Literal

Bound = Literal["compute", "memory"]


def _q(value: float | int) -> Fraction:
    """A decimal-exact rational: 0.1 is 1/10, not the nearest binary float."""
    return Fraction(repr(float(value))) if isinstance(value, float) else Fraction(value)


@dataclass(frozen=True)
class PerfParams:
    request_overhead_s: float
    step_s: float
    per_sequence_s: float
    per_prefill_token_s: float
    tail_e2e: float = 1.0
    tail_ttft: float = 1.0

    def __post_init__(self) -> None:
        values = (self.request_overhead_s, self.step_s, self.per_sequence_s, self.per_prefill_token_s)
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise ValueError("compute-model times must be finite and >= 0")
        if any(not math.isfinite(v) or v < 1 for v in (self.tail_e2e, self.tail_ttft)):
            raise ValueError("tail factors (p95 / mean) must be finite and >= 1")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Workload:
    prompt_tokens: float
    output_tokens: float
    prefix_share: float = 0.0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0 or self.output_tokens < 1:
            raise ValueError("a workload needs prompt tokens >= 0 and output tokens >= 1")
        if not 0 <= self.prefix_share < 1:
            raise ValueError(f"prefix_share must be in [0, 1), got {self.prefix_share}")

    @property
    def prefill_tokens(self) -> Fraction:
        """P_u = P × (1 − s)."""
        return _q(self.prompt_tokens) * (1 - _q(self.prefix_share))


def step_time(params: PerfParams, sequences: float, prefill_tokens: float) -> float:
    """t(n, p) = a + b·n + g·p."""
    p = params
    return float(_q(p.step_s) + _q(p.per_sequence_s) * _q(sequences) + _q(p.per_prefill_token_s) * _q(prefill_tokens))


@dataclass(frozen=True)
class Latency:
    """Steady-state means (seconds) and throughput at one concurrency, in closed form."""

    concurrency: int
    ttft_s: float
    tpot_s: float
    e2e_s: float
    throughput_rps: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def latency(params: PerfParams, workload: Workload, concurrency: int) -> Latency:
    """TTFT, TPOT, E2E (means) and X at concurrency N in closed form (see the module docstring)."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    c, a, b, g = _terms(params)
    n, out, pu = Fraction(concurrency), _q(workload.output_tokens), workload.prefill_tokens
    ttft = c + a + b * n + g * n * pu
    tpot = a + b * n
    e2e = ttft + (out - 1) * tpot
    return Latency(
        concurrency=concurrency,
        ttft_s=float(ttft),
        tpot_s=float(tpot),
        e2e_s=float(e2e),
        throughput_rps=float(n / e2e) if e2e > 0 else math.inf,
    )


def _terms(params: PerfParams) -> tuple[Fraction, Fraction, Fraction, Fraction]:
    p = params
    return _q(p.request_overhead_s), _q(p.step_s), _q(p.per_sequence_s), _q(p.per_prefill_token_s)


@dataclass(frozen=True)
class ComputeKnee:
    """The largest concurrency meeting the SLOs (None: compute does not bind below the search's ceiling),
    the SLO that binds, and the arithmetic (cluster/capacity/compute_knee.py)."""

    concurrency: int | None
    metric: str  # which SLO binds: "e2e" or "ttft"
    steps: tuple[tuple[str, float, str], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "metric": self.metric, "steps": [list(s) for s in self.steps]}


@dataclass(frozen=True)
class BoundedLimit:
    """min(memory bound, compute bound) and which one binds."""

    admission_limit: int
    bound: Bound
    memory_limit: int
    compute_limit: int | None

    @property
    def line(self) -> str:
        compute = ">= memory" if self.compute_limit is None else str(self.compute_limit)
        return f"min(memory {self.memory_limit}, compute {compute}) = {self.admission_limit} ({self.bound} binds)"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "arithmetic": self.line}


def bounded_limit(memory_limit: int, compute_limit: int | None) -> BoundedLimit:
    """The admission limit = min(memory, compute); ties and an unbounded compute side name memory."""
    if compute_limit is None or memory_limit <= compute_limit:
        return BoundedLimit(memory_limit, "memory", memory_limit, compute_limit)
    return BoundedLimit(compute_limit, "compute", memory_limit, compute_limit)
