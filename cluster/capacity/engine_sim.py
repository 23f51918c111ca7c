"""A step-level simulation of one vLLM engine under a closed-loop load: the latencies the compute model predicts.

The engine (vLLM's V1 scheduler, as configured by `max_num_batched_tokens` B and `max_num_seqs` S) runs
in steps. In each step:

    1. every decoding sequence gets one token (decodes are scheduled first),
    2. the remaining budget B − decodes goes to prompts in arrival order (FCFS): the one partly
       prefilled first, then new ones while fewer than S sequences are running; a prompt that does not
       fit the remaining budget is prefilled in part and continues next step (chunked prefill),
    3. the step takes t(n, p) = a + b·n + g·p seconds (cluster/capacity/compute_model.py), n = sequences in the
       step (decoding + prefilling), p = prompt tokens prefilled in it.

A request's first token comes at the end of the step that finishes its prompt; each later step adds
one token, so a request of O output tokens finishes O − 1 steps after its prefill. The client side
adds c (the request overhead) before the request reaches the engine.

The load is the bench's closed loop (bench/load/loadgen.py): N clients send at once (a burst), and each
client sends its next request as soon as its previous one finishes, until `requests` have finished.
The burst is what makes the tail: the prompts of N simultaneous arrivals are chunked over
⌈N·P_u / B⌉ steps, and the last of them waits for all the others; later requests spread out.

Every request has the workload's prompt (P_u = P·(1 − s) tokens prefilled, at least 1: the engine
computes the last prompt token even on a full prefix-cache hit) and O output tokens. Deterministic
and pure; the cost is O(steps), about requests / N × (O + the burst's chunks) steps.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cluster.capacity.compute_model import PerfParams, Workload
from router.percentile import linear_percentile

# vLLM 0.32's scheduler defaults for the OpenAI server (what Ray Serve's LLMServer starts): CPU
# 2048 tokens / 128 sequences; GPUs below 70 GiB 2048 / 256, H100/H200-class 8192 / 1024, 160 GiB+ 16384 / 1024.
CPU_LIMITS = (2048, 128)
GPU_LIMITS = ((160, 16384, 1024), (70, 8192, 1024), (0, 2048, 256))


@dataclass(frozen=True)
class EngineLimits:
    """The scheduler's per-step token budget B and its cap S on running sequences."""

    max_num_batched_tokens: int = CPU_LIMITS[0]
    max_num_seqs: int = CPU_LIMITS[1]
    source: str = "vLLM's CPU defaults"

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_seqs must be >= 1 and max_num_batched_tokens >= max_num_seqs (as vLLM requires)")

    def to_dict(self) -> dict[str, Any]:
        return {"max_num_batched_tokens": self.max_num_batched_tokens, "max_num_seqs": self.max_num_seqs}


def default_limits(accelerator: str, engine_args: dict[str, Any], gpu_memory_gib: float | None = None) -> EngineLimits:
    """`engine_args` where set, else vLLM's defaults for the accelerator (GPU: by its memory; unknown: the
    smallest GPU defaults)."""
    if accelerator == "cpu":
        tokens, seqs, source = *CPU_LIMITS, "vLLM's CPU defaults"
    else:
        memory = gpu_memory_gib or 0.0
        _, tokens, seqs = next(row for row in GPU_LIMITS if memory >= row[0])
        source = f"vLLM's defaults for a {memory:g} GiB GPU" if gpu_memory_gib else "vLLM's smallest-GPU defaults"
    given = [engine_args.get(key) for key in ("max_num_batched_tokens", "max_num_seqs")]
    chosen = [
        value if isinstance(value, int) else default for value, default in zip(given, (tokens, seqs), strict=True)
    ]
    if all(isinstance(value, int) for value in given):
        source = "engine_args"
    elif any(isinstance(value, int) for value in given):
        source += ", engine_args where set"
    return EngineLimits(chosen[0], chosen[1], source)


@dataclass(frozen=True)
class Protocol:
    """The closed loop measured: `requests(N)` = max(requests_per_level, waves × N, 1) requests at N."""

    requests_per_level: int = 0
    waves: int = 4

    def requests(self, concurrency: int) -> int:
        return max(self.requests_per_level, self.waves * concurrency, 1)

    @property
    def text(self) -> str:
        counts = [f"{self.waves} × N"] if self.waves else []
        counts += [str(self.requests_per_level)] if self.requests_per_level else []
        many = f"max({', '.join(counts)})" if len(counts) > 1 else (counts or ["1"])[0]
        return f"closed loop of {many} requests, N sent at once, each finished one sending the next"


@dataclass(frozen=True)
class Simulated:
    """Per-request latencies of one simulated run and their summaries."""

    concurrency: int
    ttft_s: tuple[float, ...]
    e2e_s: tuple[float, ...]
    steps: int

    @property
    def mean_ttft_s(self) -> float:
        return statistics.fmean(self.ttft_s)

    @property
    def mean_e2e_s(self) -> float:
        return statistics.fmean(self.e2e_s)

    def p95_s(self, metric: str) -> float:
        return p95(self.e2e_s if metric == "e2e" else self.ttft_s)


def p95(values: Sequence[float]) -> float:
    """The p95 as the bench summarises a level (linear interpolation); the runs are never empty."""
    value = linear_percentile(values, 95)
    assert value is not None
    return value


def simulate(
    params: PerfParams, workload: Workload, limits: EngineLimits, concurrency: int, requests: int
) -> Simulated:
    """Run the closed loop of the module docstring; the latencies of the `requests` that finish first."""
    if concurrency < 1 or requests < 1:
        raise ValueError("concurrency and requests must be >= 1")
    c, a, b, g = params.request_overhead_s, params.step_s, params.per_sequence_s, params.per_prefill_token_s
    prompt = max(1, round(float(workload.prefill_tokens)))
    output = max(1, round(workload.output_tokens))
    budget_cap, seq_cap = limits.max_num_batched_tokens, limits.max_num_seqs
    waiting: deque[list[float]] = deque()  # [sent_at, arrives_at, prompt tokens left]; FCFS
    finishing: dict[int, list[float]] = {}  # step index -> sent_at of the requests whose last token it makes
    ttft: list[float] = []
    e2e: list[float] = []
    sent = 0
    now, step, decoding, partial = 0.0, 0, 0, 0

    def send(at: float) -> None:
        nonlocal sent
        if sent < requests:
            sent += 1
            waiting.append([at, at + c, float(prompt)])

    for _ in range(min(concurrency, requests)):
        send(0.0)
    while len(e2e) < requests:
        if decoding == 0 and waiting and waiting[0][1] > now:
            now = waiting[0][1]  # idle until the next arrival
        budget = max(0, budget_cap - decoding)
        sequences, prefilled, running = decoding, 0, decoding + partial
        done_prefill: list[float] = []
        for item in waiting:
            if budget <= 0 or item[1] > now:
                break
            fresh = item[2] == prompt
            if fresh and running >= seq_cap:
                break
            take = min(budget, int(item[2]))
            budget -= take
            prefilled += take
            sequences += 1
            running += 1 if fresh else 0
            item[2] -= take
            if item[2] <= 0:
                done_prefill.append(item[0])
        partial = running - decoding - len(done_prefill)
        for _ in done_prefill:
            waiting.popleft()
        now += a + b * sequences + g * prefilled
        step += 1
        for sent_at in done_prefill:
            ttft.append(now - sent_at)
            finishing.setdefault(step + output - 1, []).append(sent_at)
        decoding += len(done_prefill)
        for sent_at in finishing.pop(step, []):
            decoding -= 1
            e2e.append(now - sent_at)
            send(now)
    return Simulated(concurrency, tuple(ttft[:requests]), tuple(e2e[:requests]), step)
