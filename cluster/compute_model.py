"""The compute model: latency at concurrency N from a per-engine-step time, and the knee it predicts.

Parameters (`PerfParams`, fitted per model and machine by `bench calibrate`, cluster/compute_fit.py):

    c   request_overhead_s    time per request outside the engine's steps (HTTP, gateway, tokenizer)
    a   step_s                fixed time of one engine step
    b   per_sequence_s        added per sequence in the step
    g   per_prefill_token_s   added per prompt token prefilled in the step
    tail_e2e, tail_ttft       p95 / mean of e2e and TTFT (1 = no spread)

One engine step that carries n sequences and prefills p prompt tokens takes

    t(n, p) = a + b·n + g·p

A workload is a prompt of P tokens, O output tokens and a prefix share s (the part of the prompt
the prefix cache already holds, not prefilled again): P_u = P·(1 − s) tokens are prefilled.
At concurrency N (closed loop: N requests in flight, equal lengths, so they arrive, prefill and
decode together), one request sees one step that prefills all N prompts, then O − 1 decode steps:

    TTFT(N) = c + t(N, N·P_u)       = c + a + b·N + g·N·P_u
    TPOT(N) = t(N, 0)               = a + b·N
    E2E(N)  = TTFT + (O − 1)·TPOT   = c + O·a + N·(O·b + P_u·g)
    X(N)    = N / E2E(N)            requests/s (Little's law; it tends to 1 / (O·b + P_u·g))

E2E does not depend on the cohort assumption: with requests spread out, each step still carries
N sequences and on average N·P_u / O prefill tokens, and Little's law gives the same E2E. TTFT
does: spread-out requests wait for fewer prompts, so TTFT(N) is then an upper bound.

p95 = tail × mean. The knee for an SLO S is the largest N ≥ 1 with p95 ≤ S, in closed form:

    N_e2e  = ⌊(S / tail_e2e  − c − O·a) / (O·b + P_u·g)⌋
    N_ttft = ⌊(S / tail_ttft − c − a)   / (b + g·P_u)⌋
    compute bound = the smaller of the SLOs given (0: not even one request meets it)

The admission limit is min(memory bound, compute bound) and names the one that binds (ties name
memory): the memory bound is cluster/capacity.py's ⌊fraction × KV max concurrency⌋.
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
    """Predicted means and p95s (seconds) and throughput at one concurrency."""

    concurrency: int
    ttft_s: float
    tpot_s: float
    e2e_s: float
    ttft_p95_s: float
    e2e_p95_s: float
    throughput_rps: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def latency(params: PerfParams, workload: Workload, concurrency: int) -> Latency:
    """TTFT, TPOT, E2E (means and p95) and X at concurrency N (see the module docstring)."""
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
        ttft_p95_s=float(ttft * _q(params.tail_ttft)),
        e2e_p95_s=float(e2e * _q(params.tail_e2e)),
        throughput_rps=float(n / e2e) if e2e > 0 else math.inf,
    )


def _terms(params: PerfParams) -> tuple[Fraction, Fraction, Fraction, Fraction]:
    p = params
    return _q(p.request_overhead_s), _q(p.step_s), _q(p.per_sequence_s), _q(p.per_prefill_token_s)


@dataclass(frozen=True)
class ComputeKnee:
    """The largest concurrency meeting the SLOs (None: unbounded, no per-N cost), with its arithmetic."""

    concurrency: int | None
    metric: str  # which SLO binds: "e2e" or "ttft"
    steps: tuple[tuple[str, float, str], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "metric": self.metric, "steps": [list(s) for s in self.steps]}


def _floor_knee(budget: Fraction, slope: Fraction) -> int | None:
    if slope <= 0:
        return None if budget >= 0 else 0
    return max(0, math.floor(budget / slope))


def compute_knee(
    params: PerfParams, workload: Workload, *, slo_e2e_p95_s: float | None = None, slo_ttft_p95_s: float | None = None
) -> ComputeKnee:
    """N_e2e and N_ttft for the SLOs given, and the smaller of them (at least one SLO is needed)."""
    if slo_e2e_p95_s is None and slo_ttft_p95_s is None:
        raise ValueError("the compute bound needs an SLO: slo_e2e_p95_s or slo_ttft_p95_s")
    c, a, b, g = _terms(params)
    out, pu = _q(workload.output_tokens), workload.prefill_tokens
    steps: list[tuple[str, float, str]] = [
        (
            "prefill tokens per request",
            _num(pu),
            f"P_u = {_num(workload.prompt_tokens)} × (1 − {workload.prefix_share})",
        )
    ]
    knees: list[tuple[int | None, str]] = []
    p = params
    if slo_e2e_p95_s is not None:
        _check_slo(slo_e2e_p95_s)
        base, slope = c + out * a, out * b + pu * g
        n = _floor_knee(_q(slo_e2e_p95_s) / _q(p.tail_e2e) - base, slope)
        o = _num(out)
        per_n = f"O·b + P_u·g = {o} × {p.per_sequence_s} + {_num(pu)} × {p.per_prefill_token_s}"
        knee = f"⌊({slo_e2e_p95_s:g} / {p.tail_e2e} − {_num(base)}) / {_num(slope)}⌋ (e2e p95 ≤ {slo_e2e_p95_s:g} s)"
        steps += [
            ("e2e at N=0 (s)", _num(base), f"c + O·a = {p.request_overhead_s} + {o} × {p.step_s}"),
            ("e2e per concurrent request (s)", _num(slope), per_n),
            ("compute bound, e2e", _knee_value(n), knee),
        ]
        knees.append((n, "e2e"))
    if slo_ttft_p95_s is not None:
        _check_slo(slo_ttft_p95_s)
        base, slope = c + a, b + g * pu
        n = _floor_knee(_q(slo_ttft_p95_s) / _q(p.tail_ttft) - base, slope)
        per_n = f"b + g·P_u = {p.per_sequence_s} + {p.per_prefill_token_s} × {_num(pu)}"
        knee = (
            f"⌊({slo_ttft_p95_s:g} / {p.tail_ttft} − {_num(base)}) / {_num(slope)}⌋ (TTFT p95 ≤ {slo_ttft_p95_s:g} s)"
        )
        steps += [
            ("ttft at N=0 (s)", _num(base), f"c + a = {p.request_overhead_s} + {p.step_s}"),
            ("ttft per concurrent request (s)", _num(slope), per_n),
            ("compute bound, ttft", _knee_value(n), knee),
        ]
        knees.append((n, "ttft"))
    bounded = [(n, m) for n, m in knees if n is not None]
    if not bounded:
        return ComputeKnee(None, knees[0][1], tuple(steps))
    n, metric = min(bounded, key=lambda nm: nm[0])
    if len(knees) > 1:
        steps.append(("compute bound", n, f"min of e2e and ttft bounds ({metric} binds)"))
    return ComputeKnee(n, metric, tuple(steps))


def _check_slo(value: float) -> None:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"an SLO must be a finite number of seconds > 0, got {value}")


def _knee_value(n: int | None) -> float:
    return math.inf if n is None else n


def _num(value: float | Fraction) -> int | float:
    value = float(value)
    return int(value) if value.is_integer() else round(value, 6)


@dataclass(frozen=True)
class BoundedLimit:
    """min(memory bound, compute bound) and which one binds."""

    admission_limit: int
    bound: Bound
    memory_limit: int
    compute_limit: int | None

    @property
    def line(self) -> str:
        compute = "unbounded" if self.compute_limit is None else str(self.compute_limit)
        return f"min(memory {self.memory_limit}, compute {compute}) = {self.admission_limit} ({self.bound} binds)"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "arithmetic": self.line}


def bounded_limit(memory_limit: int, compute_limit: int | None) -> BoundedLimit:
    """The admission limit = min(memory, compute); ties and an unbounded compute side name memory."""
    if compute_limit is None or memory_limit <= compute_limit:
        return BoundedLimit(memory_limit, "memory", memory_limit, compute_limit)
    return BoundedLimit(compute_limit, "compute", memory_limit, compute_limit)
