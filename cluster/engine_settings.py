"""What a model replica needs to know about its own engine beyond vLLM's arguments. Pure.

Carried from the config to the replica in `LLMConfig.experimental_configs["spillover_engine"]`
(serve_apps/engine/llm.py), read there by serve_apps/engine/llm_server.py: the precision policy, the numerics
check, the stall bound and, for vLLM-CPU, how many OpenMP threads its engine runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from cluster.capacity.engine_sim import default_limits
from cluster.config.model_spec import ModelSpec
from cluster.config.numerics import NumericsSettings

ENGINE_KEY = "spillover_engine"
STALL_FLOOR_S = 30.0
STALL_STEPS = 20  # a stall is this many of the fitted model's slowest steps without one


@dataclass(frozen=True)
class EngineSettings:
    precision: str  # models[].precision: auto | bfloat16 | float32 (vLLM-CPU only; "" elsewhere)
    numerics: dict[str, Any] | None  # NumericsSettings as a dict; None: no check
    stall_s: float
    cpu_threads: int | None  # vLLM-CPU: OpenMP threads (cores) of the engine; None: not a CPU engine

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> EngineSettings:
        if not data:
            return cls("", None, STALL_FLOOR_S, None)
        return cls(**{k: data[k] for k in ("precision", "numerics", "stall_s", "cpu_threads") if k in data})

    @property
    def numerics_settings(self) -> NumericsSettings | None:
        return None if self.numerics is None else NumericsSettings(**self.numerics)


def stall_bound_s(spec: ModelSpec) -> float:
    """`models[].stall_s`, else 30 s or `STALL_STEPS` of the fitted model's slowest step (a full prefill
    chunk beside a full batch; with fits for several machines, the slowest machine's), whichever is longer."""
    if spec.stall_s is not None:
        return spec.stall_s
    if not spec.perf:
        return STALL_FLOOR_S
    limits = default_limits("cpu" if spec.runs_vllm_cpu else "gpu", dict(spec.engine_args))
    slowest = max(
        p.step_s + p.per_sequence_s * limits.max_num_seqs + p.per_prefill_token_s * limits.max_num_batched_tokens
        for p in spec.perf
    )
    return max(STALL_FLOOR_S, round(STALL_STEPS * slowest, 1))


def engine_settings(spec: ModelSpec) -> EngineSettings:
    return EngineSettings(
        precision=spec.precision if spec.runs_vllm_cpu else "",
        numerics=None if spec.numerics is None else spec.numerics.model_dump(),
        stall_s=stall_bound_s(spec),
        cpu_threads=max(1, math.floor(spec.num_cpus)) if spec.runs_vllm_cpu else None,
    )
