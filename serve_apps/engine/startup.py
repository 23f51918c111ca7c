"""What a model replica decides about its engine before starting it, and checks right after.

Before the engine starts (`prepare`): for a vLLM-CPU engine, the CPU it runs on (cluster/hardware/cpu_caps.py),
the precision (cluster/precision/choice.py: `models[].precision`, the model's own bf16 sensitivity from its
reference, what this node learnt before in cluster/precision/memory.py) and the cores its OpenMP
threads are bound to (serve_apps/engine/cpus.py) — applied to the engine's arguments and environment.
After it started (`verify`): the numerics check against the model's float32 reference
(serve_apps/engine/numerics_probe.py). Everything decided is kept as notes the replica pushes with its stats,
so `spillover status`, `/readyz` and the logs say which precision runs and why.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from cluster.engine_settings import EngineSettings
from cluster.hardware.cpu_caps import CpuCaps
from cluster.precision.choice import Precision, PrecisionChoice
from cluster.precision.local import local_choice
from cluster.precision.memory import PrecisionMemory
from cluster.precision.numerics_check import NumericsVerdict
from cluster.precision.numerics_reference import load_reference
from serve_apps.engine.cpus import Binding, claim_cores
from serve_apps.engine.numerics_probe import check

log = logging.getLogger("spillover.engine")
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


class BF16Rejected(RuntimeError):
    """`auto` chose bf16 and the engine failed its numerics check: the replica restarts in float32."""


class EngineSetup:
    def __init__(self, engine_kwargs: dict[str, Any], source: str, settings: EngineSettings) -> None:
        self.settings = settings
        self.source = source
        self._engine_kwargs = engine_kwargs
        folder = Path(source)
        self.reference = load_reference(folder) if folder.is_dir() else None
        self.caps: CpuCaps | None = None
        self.choice: PrecisionChoice | None = None
        self.binding: Binding | None = None
        self._memory: PrecisionMemory | None = None
        self.notes: list[str] = []

    @property
    def is_cpu(self) -> bool:
        return self.settings.cpu_threads is not None

    def prepare(self) -> dict[str, Any]:
        """The engine arguments the precision sets (only those); binds its threads (vLLM-CPU only)."""
        if not self.is_cpu:
            return {}
        precision: Precision = self.settings.precision or "auto"  # type: ignore[assignment]
        self.choice, self.caps, self._memory = local_choice(
            precision, self._engine_kwargs, self.source, self.settings.numerics_settings
        )
        self.notes.append(f"precision {self.choice.label}: {self.choice.reason}")
        if BIND_ENV in os.environ:
            self.notes.append(f"threads bound by the operator's {BIND_ENV}={os.environ[BIND_ENV]}")
        else:
            self.binding = claim_cores(self.settings.cpu_threads or 1)
            os.environ[BIND_ENV] = self.binding.spec
            self.notes.append(f"engine threads: {self.binding.describe()}")
        for note in self.notes:
            log.info("%s", note)
        chosen = self.choice.engine_kwargs(self._engine_kwargs)
        return {key: value for key, value in chosen.items() if self._engine_kwargs.get(key, object()) != value}

    @property
    def dtype(self) -> str:
        if self.choice is not None:
            return self.choice.dtype
        return str(self._engine_kwargs.get("dtype", "auto"))

    async def verify(self, client: Any) -> NumericsVerdict:
        """The start-up numerics check. Raises BF16Rejected where `auto` should fall back to float32."""
        numerics = self.settings.numerics_settings
        if numerics is None:
            return NumericsVerdict("unchecked", "numerics check off (models[].numerics is null)")
        if self.reference is None:
            return NumericsVerdict(
                "unchecked", "no float32 reference for this model (spillover models prepare writes one)"
            )
        verdict = await check(client, self.reference, numerics, self.dtype)
        if not verdict.routable and self.choice is not None and self.choice.auto and self.dtype == "bfloat16":
            assert self._memory is not None
            self._memory.record_bf16_failure(verdict.reason)
            raise BF16Rejected(
                f"bf16 failed the numerics check on {self.caps.describe() if self.caps else 'this CPU'} "
                f"({verdict.reason}); recorded in {self._memory.path}: the replica restarts in float32"
            )
        return verdict

    async def recheck(self, client: Any) -> NumericsVerdict | None:
        numerics = self.settings.numerics_settings
        if numerics is None or self.reference is None:
            return None
        return await check(client, self.reference, numerics, self.dtype)
