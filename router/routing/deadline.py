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

It ignores requests that arrive after this one (they slow it: the admission limit bounds how much), so it is
optimistic in a growing burst and the re-check while waiting is what keeps a waiting request honest.
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

    @property
    def finish_s(self) -> float:
        return self.wait_s + self.e2e_s

    @property
    def meets(self) -> bool:
        return self.finish_s <= self.left_s

    def line(self) -> str:
        wait = f" after a {self.wait_s:.1f} s wait" if self.wait_s > 0 else ""
        return f"predicted local e2e {self.e2e_s:.1f} s{wait}, {self.left_s:.1f} s to the deadline ({self.detail})"


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
    return LocalForecast(e2e, wait, left_s, can_wait, detail)
