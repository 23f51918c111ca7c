"""Deadline-aware spill: will this request finish locally before its deadline?

Pure. The caller (serve_apps/dispatch/admission.py) builds a `LocalForecast` when the model's fitted compute model
(`models[].perf`, cluster/capacity/compute_model.py) describes its replicas and the request has a deadline
(`x-spillover-deadline-ms`, else its scenario's `deadline_ms`, else the model's `perf.slo_e2e_p95_s`); the burst
decision (router/routing/burst.py) then:

    local room, predicted e2e within the time left           -> local
    local room, predicted e2e past it, the request may burst -> cloud at once
    at the admission limit, may burst:
        predicted wait + e2e within the time left (and room to wait) -> wait; re-planned as the queue moves
        otherwise                                                    -> cloud at once
    local_only                                               -> local / wait as without a forecast

The prediction, per replica, with n = the requests in flight on it + this one, every running sequence decoding
one token a step and the others' prompts prefilled in their share of the steps (P̄_u / Ō per sequence a step):

    TPOT  = a + b·n + g·(n − 1)·P̄_u / Ō
    e2e   = tail_e2e × (c + a + b·n + g·P_u + (O − 1)·TPOT)       (P_u: this prompt's tokens not in the cache)
    wait  = (ahead + 1) / X,  X = R · L / E2E(L)                   (at the limit L per replica, R replicas: the
                                                                   rate requests leave, Little's law)

No harm: a newcomer also slows the requests already running — its prefill adds g·P_u to one step of each, its
decode b to every step they share. The gateway keeps each local request's deadline and predicted finish
(`Running`); `harm` counts the running requests that would finish in time without the newcomer and late with it,
and a request that may burst and would make one late goes to the cloud, as if it were late itself. Each admission
moves the running requests' predicted finishes by the delay it adds (`delayed`), so the forecasts follow the
batch as it grows.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepModel:
    """The fitted compute model's terms (cluster/capacity/compute_model.py `PerfParams`; router/ does not import it)."""

    request_overhead_s: float  # c
    step_s: float  # a
    per_sequence_s: float  # b
    per_prefill_token_s: float  # g
    tail_e2e: float = 1.0


@dataclass(frozen=True)
class LocalForecast:
    e2e_s: float  # predicted end-to-end if it starts now (with room) or once admitted (at the limit)
    wait_s: float  # predicted wait for local room (0 with room)
    left_s: float  # time left before the request's deadline
    can_wait: bool  # room in the gateway's waiting room
    detail: str  # the inputs, for the reason and the decision record
    harms: int = 0  # running requests it would make late
    prefill_tokens: float = 0.0
    output_tokens: float = 0.0

    @property
    def finish_s(self) -> float:
        return self.wait_s + self.e2e_s

    @property
    def meets(self) -> bool:
        """In time itself, and no running request made late."""
        return self.finish_s <= self.left_s and self.harms == 0

    def line(self) -> str:
        wait = f" after a {self.wait_s:.1f} s wait" if self.wait_s > 0 else ""
        hurt = f"; it would make {self.harms} running request(s) late" if self.harms else ""
        left = f"{self.left_s:.1f} s to the deadline"
        return f"predicted local e2e {self.e2e_s:.1f} s{wait}, {left}{hurt} ({self.detail})"


@dataclass(frozen=True)
class Running:
    """A request running locally: when its deadline falls and when it is predicted to finish (the same clock)."""

    deadline_at: float
    finish_at: float


def delay(params: StepModel, running: Running, now: float, *, prefill_tokens: float, output_tokens: float) -> float:
    """What a newcomer adds to a running request's finish: one step carries its prefill, and every step the two
    share one more sequence (as many as the newcomer's outputs, at most the running one's steps left)."""
    tpot = params.step_s + params.per_sequence_s
    steps_left = max(0.0, running.finish_at - now) / tpot if tpot > 0 else 0.0
    shared = min(output_tokens, steps_left)
    return params.tail_e2e * (params.per_prefill_token_s * prefill_tokens + params.per_sequence_s * shared)


def harm(params: StepModel, running: list[Running], now: float, *, prefill_tokens: float, output_tokens: float) -> int:
    """How many running requests, in time now, the newcomer would make late."""
    late = 0
    for r in running:
        if r.finish_at <= r.deadline_at:
            added = delay(params, r, now, prefill_tokens=prefill_tokens, output_tokens=output_tokens)
            late += r.finish_at + added > r.deadline_at
    return late


@dataclass(frozen=True)
class Load:
    """One model's local load, per replica, and the workload mix the others bring."""

    inflight: int  # requests in flight on the model (all replicas, all gateways)
    replicas: int
    limit: int | None  # admission limit for the whole model (None: none)
    ahead: int  # requests already waiting for local room
    mean_prompt_tokens: float  # the mix's prompt tokens not in the prefix cache, per request
    mean_output_tokens: float


def _e2e(params: StepModel, n: float, prefill: float, output: float, mix_prefill: float, mix_output: float) -> float:
    a, b, c, g = params.step_s, params.per_sequence_s, params.request_overhead_s, params.per_prefill_token_s
    tpot = a + b * n + g * max(0.0, n - 1) * mix_prefill / max(1.0, mix_output)
    return params.tail_e2e * (c + a + b * n + g * prefill + max(0.0, output - 1) * tpot)


def forecast(
    params: StepModel,
    load: Load,
    *,
    prefill_tokens: float,
    output_tokens: float,
    left_s: float,
    can_wait: bool,
    running: list[Running] | None = None,
    now: float = 0.0,
) -> LocalForecast:
    """The forecast of one request (see the module docstring)."""
    replicas = max(1, load.replicas)
    at_limit = load.limit is not None and load.inflight >= load.limit
    per_replica = (min(load.inflight, load.limit) if load.limit is not None else load.inflight) / replicas
    n = per_replica + 1 if not at_limit else max(1.0, per_replica)
    e2e = _e2e(params, n, prefill_tokens, output_tokens, load.mean_prompt_tokens, load.mean_output_tokens)
    wait = 0.0
    if at_limit:
        mean = _e2e(params, n, load.mean_prompt_tokens, load.mean_output_tokens, load.mean_prompt_tokens,
                    load.mean_output_tokens)  # fmt: skip
        rate = replicas * n / mean if mean > 0 else float("inf")
        wait = (load.ahead + 1) / rate
    detail = (
        f"{load.inflight} in flight on {replicas} replica(s)"
        + (f", limit {load.limit}, {load.ahead} waiting" if load.limit is not None else "")
        + f"; prompt {prefill_tokens:.0f} to prefill, {output_tokens:.0f} to generate"
    )
    harms = harm(params, running or [], now, prefill_tokens=prefill_tokens, output_tokens=output_tokens)
    return LocalForecast(e2e, wait, left_s, can_wait, detail, harms, prefill_tokens, output_tokens)
