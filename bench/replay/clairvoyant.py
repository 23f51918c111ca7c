"""A clairvoyant admission on a replayed trace: a schedule that meets the SLO for every request it keeps local, to
set beside the offline lower bound (bench/replay/bound.py). The fewest cloud requests any scheduler needs lies
between the two: at least the bound, at most what this schedule sends.

It knows every request's prompt and output length when it arrives and runs the engine of the fitted model, step by
step (vLLM's scheduler as cluster/capacity/engine_sim.py describes it: decodes first, then prompts in arrival order
within the `max_num_batched_tokens` budget, chunked; a step of n sequences and p prompt tokens takes
a + b·n + g·p). At each arrival it keeps the request local when the engine, finishing everything admitted so far
plus this one, would meet every admitted deadline (arrival + SLO, less the request overhead c); else the request
goes to the cloud (where it meets the SLO: the cloud is not the constraint here). Greedy: it never takes back an
admission for a later request, so an optimal scheduler may send fewer. Prefix cache: perfect (P_u), tails left out
— the same optimism as the bound, so the two frame the same model's optimum.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from bench.replay.bound import StepTerms, unshared_prompts
from bench.replay.scaling import ScaledRequest
from cluster.capacity.engine_sim import CPU_LIMITS

MAX_NUM_BATCHED_TOKENS = CPU_LIMITS[0]  # vLLM-CPU's token budget a step (its cap of running sequences not modelled)


@dataclass(frozen=True)
class Sequence:
    prompt_left: int  # prompt tokens still to prefill
    outputs_left: int  # tokens still to generate (the first comes with the step that ends the prefill)
    due: float  # when it must finish (engine time)


@dataclass(frozen=True)
class Schedule:
    cloud: int  # requests the schedule sends to the cloud
    share: float
    method: str = (
        "clairvoyant greedy admission on the fitted engine (decodes first, FCFS chunked prefill within 2,048 "
        "tokens a step, perfect prefix cache, no tails)"
    )

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.cloud, "share": self.share, "method": self.method}


def _step(running: list[Sequence], a: float, b: float, g: float) -> tuple[list[Sequence], float, list[Sequence]]:
    """One engine step: (the sequences still running, its duration, the ones it finished)."""
    budget = MAX_NUM_BATCHED_TOKENS
    decoding = [s for s in running if s.prompt_left == 0]
    budget -= len(decoding)
    after: list[Sequence] = []
    prefilled, scheduled = 0, len(decoding)
    for s in running:
        if s.prompt_left == 0:
            after.append(replace(s, outputs_left=s.outputs_left - 1))
        elif budget > 0:
            chunk = min(budget, s.prompt_left)
            budget -= chunk
            prefilled += chunk
            scheduled += 1
            left = s.prompt_left - chunk
            after.append(replace(s, prompt_left=left, outputs_left=s.outputs_left - (1 if left == 0 else 0)))
        else:
            after.append(s)
    duration = a + b * scheduled + g * prefilled
    return [s for s in after if s.outputs_left > 0], duration, [s for s in after if s.outputs_left <= 0]


def _all_in_time(running: list[Sequence], now: float, terms: StepTerms) -> bool:
    a, b, g = terms.step_s, terms.per_sequence_s, terms.per_prefill_token_s
    while running:
        running, duration, done = _step(running, a, b, g)
        now += duration
        if any(now > s.due + 1e-9 for s in done) or any(now > s.due + 1e-9 for s in running):
            return False
    return True


def clairvoyant(requests: tuple[ScaledRequest, ...], terms: StepTerms, slo_s: float) -> Schedule:
    """The cloud requests of a greedy clairvoyant admission (one replica) on these arrivals."""
    if not requests:
        return Schedule(0, 0.0)
    a, b, g = terms.step_s, terms.per_sequence_s, terms.per_prefill_token_s
    prompts = unshared_prompts(requests)
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    running: list[Sequence] = []
    now, cloud = 0.0, 0
    for i in order:
        r = requests[i]
        while running and now < r.arrival_s:  # the engine runs until this arrival
            running, duration, _ = _step(running, a, b, g)
            now += duration
        now = max(now, r.arrival_s) if not running else now
        due = r.arrival_s + slo_s - terms.request_overhead_s
        candidate = [*running, Sequence(max(1, int(prompts[i])), max(1, r.output_tokens), due)]
        if _all_in_time(candidate, now, terms):
            running = candidate
        else:
            cloud += 1
    return Schedule(cloud, cloud / len(requests))
