"""The burst decision: stay local, go to a cloud provider, or wait for local room.

Pure. Inputs are the immutable snapshot, the gateway's own counters and the previous
hysteresis latches; the output is a `RouteDecision` plus the new latches. Nothing here reads
a clock, awaits, or touches the network.

    every local replica of the model saturated (or stale, or none reporting)
        ├── request may leave the cluster and a provider serves the alias  -> cloud
        └── otherwise (local_only, or no provider)                         -> wait (bounded queue)
    some replica has room, but the model's admission limit is reached
        └── same two branches
    otherwise                                                              -> local

With a deadline forecast (router/routing/deadline.py: the model's fitted compute model describes its replicas and
the request has a deadline), a request that may burst goes to the cloud at once when local room would not
finish it in time, and waits for local room at the admission limit when the forecast says it would still finish
in time (re-planned as the queue moves); without one, the rules above, unchanged. With a load-proportional
share (router/routing/local_share.py, off by default), a request that may burst and whose turn is not a local one
goes to the cloud although local has room.

Hysteresis: a replica that reached saturation >= 1.0 stays "latched" (counted as saturated)
until its saturation falls below `release_ratio` = watermarks.low / watermarks.kv_cache
(0.75 / 0.85 ≈ 0.88 by default), so traffic does not flap around the watermark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from router.routing.capabilities import local_id, provider_key
from router.routing.deadline import LocalForecast
from router.routing.local_share import ShareDraw
from router.routing.saturation import Saturation, replica_saturation
from router.routing.snapshot import ClusterSnapshot
from router.routing.watermarks import Watermarks

Route = Literal["local", "cloud", "wait"]


@dataclass(frozen=True)
class BurstInputs:
    model: str
    watermarks: Watermarks
    inflight: int  # local requests of this model the gateway has in flight
    admission_limit: int | None  # for the whole model (all replicas); None = no limit
    local_only: bool
    providers: Sequence[str]  # enabled cloud providers that map this alias, in preference order
    admission_detail: str = ""  # calibrated models: which bound and which inputs set the admission limit
    forecast: LocalForecast | None = None  # deadline-aware spill: will it finish locally in time?
    share: ShareDraw | None = None  # load-proportional spill: is this request's turn a local one?


@dataclass(frozen=True)
class RouteDecision:
    route: Route
    target: str  # "local:<alias>", "cloud:<provider>" or "" while waiting
    reason: str
    latched: frozenset[str]


def release_ratio(watermarks: Watermarks) -> float:
    return watermarks.low / watermarks.kv_cache


def _latches(sats: dict[str, Saturation], previous: frozenset[str], ratio: float) -> frozenset[str]:
    latched = set()
    for replica_id, sat in sats.items():
        if sat.saturated or (replica_id in previous and sat.value >= ratio):
            latched.add(replica_id)
    return frozenset(latched)


def _local_pressure_reason(sats: dict[str, Saturation], latched: frozenset[str], ratio: float) -> str:
    worst = max(sats.values(), key=lambda s: s.value)
    held = [r for r in latched if not sats[r].saturated]
    suffix = f" (hysteresis: below {ratio:.2f} to release)" if held else ""
    return f"{worst.detail} on all {len(sats)} replicas{suffix}"


def decide(inputs: BurstInputs, snapshot: ClusterSnapshot, now: float, previous: frozenset[str]) -> RouteDecision:
    replicas = snapshot.for_model(inputs.model)
    ratio = release_ratio(inputs.watermarks)
    limited = False
    sats = {r.replica_id: replica_saturation(r, inputs.watermarks, snapshot=snapshot, now=now) for r in replicas}
    latched = _latches(sats, previous, ratio)

    if not replicas:
        reason = f"no replica of {inputs.model} has reported engine stats"
    elif len(latched) == len(sats):
        reason = _local_pressure_reason(sats, latched, ratio)
    elif inputs.admission_limit is not None and inputs.inflight >= inputs.admission_limit:
        limited = True
        reason = f"inflight {inputs.inflight} >= admission limit {inputs.admission_limit}"
        if inputs.admission_detail:
            reason += f" ({inputs.admission_detail})"
    else:
        free = len(sats) - len(latched)
        reason = f"local capacity ({free}/{len(sats)} replicas)"
        roomiest = min((sats[r] for r in sats if r not in latched), key=lambda sat: sat.value)
        if roomiest.gpu_detail:  # say what the GPUs hold: the engine's reservation is its own, not pressure
            reason += f"; {roomiest.gpu_detail}"
        if inputs.admission_detail:
            reason += (
                f"; inflight {inputs.inflight} < admission limit {inputs.admission_limit} ({inputs.admission_detail})"
            )
        forecast = inputs.forecast
        if forecast is not None and not forecast.meets and not inputs.local_only and inputs.providers:
            late = "would make running requests late" if forecast.harms else "would finish late"
            reason = f"deadline: {forecast.line()}; local has room but {late}"
            return RouteDecision("cloud", provider_key(inputs.providers[0]), reason, latched)
        share = inputs.share
        if share is not None and not share.local and not inputs.local_only and inputs.providers:
            reason = f"{share.line()}; local has room, this turn is the cloud's"
            return RouteDecision("cloud", provider_key(inputs.providers[0]), reason, latched)
        return RouteDecision("local", local_id(inputs.model), reason, latched)

    if inputs.local_only:
        return RouteDecision("wait", "", f"{reason}; local_only: waiting for local capacity", latched)
    if not inputs.providers:
        return RouteDecision("wait", "", f"{reason}; no cloud provider serves {inputs.model}", latched)
    forecast = inputs.forecast
    if forecast is not None and limited:
        if forecast.meets and forecast.can_wait:
            return RouteDecision("wait", "", f"{reason}; deadline: waiting for local room, {forecast.line()}", latched)
        why = "the waiting room is full" if forecast.meets else "it would finish late"
        why = "it would make running requests late" if forecast.harms else why
        reason = f"{reason}; deadline: {forecast.line()}: {why}"
    return RouteDecision("cloud", provider_key(inputs.providers[0]), reason, latched)
