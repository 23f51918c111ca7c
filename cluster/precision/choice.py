"""Which dtype and compile mode a vLLM-CPU engine starts in, chosen on the CPU it runs on. Pure.

`models[].precision` (vLLM-CPU models):

    auto      bfloat16, compiled, where the CPU has native bf16 (AMX-BF16 or AVX512-BF16: cluster/hardware/cpu_caps.py)
              and bf16 has not failed the model's numerics check on this CPU before (nor where the project
              measured it: cluster/precision/known.py); float32 eager otherwise
    bfloat16  bfloat16, compiled (vLLM-CPU 0.32's bf16 *eager* path answers garbage: docs/dtype.md)
    float32   float32, eager (compiled it decoded no faster and started a minute later; `enforce_eager:
              false` in engine_args compiles it anyway)

An explicit `engine_args.dtype` wins over all of this (the operator's choice, still checked).

"The result checks out" is part of the choice: the replica checks its engine's greedy tokens against
the model's float32 reference before it takes traffic (cluster/precision/numerics_check.py). When `auto` chose
bf16 and that check fails, the replica records the failure for this CPU and model
(`PrecisionMemory`) and restarts; the next start of any replica of that model on that CPU then
chooses float32 at once, and says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cluster.hardware.cpu_caps import CpuCaps

Precision = Literal["auto", "bfloat16", "float32"]


@dataclass(frozen=True)
class PrecisionChoice:
    dtype: str  # what vLLM is given (engine_args.dtype)
    compiled: bool  # False: enforce_eager
    reason: str
    auto: bool  # chosen by `auto` (a failed numerics check may then fall back)

    @property
    def label(self) -> str:
        return f"{self.dtype} {'compiled' if self.compiled else 'eager'}"

    def engine_kwargs(self, engine_args: Mapping[str, Any]) -> dict[str, Any]:
        """`engine_args` with this choice applied (an explicit enforce_eager is the operator's)."""
        out = {**engine_args, "dtype": self.dtype}
        if "enforce_eager" not in engine_args:
            out["enforce_eager"] = not self.compiled
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "compiled": self.compiled, "label": self.label, "reason": self.reason}


def choose(
    precision: Precision, engine_args: Mapping[str, Any], caps: CpuCaps, bf16_failed: str | None
) -> PrecisionChoice:
    """`bf16_failed`: why bf16 failed the numerics check on this CPU before (None: it never did)."""
    cpu = caps.describe()
    explicit = engine_args.get("dtype")
    if explicit is not None:
        compiled = not engine_args.get("enforce_eager", False)  # vLLM's own default: compiled
        return PrecisionChoice(str(explicit), compiled, f"engine_args.dtype is {explicit} (the config's choice)", False)
    # float32 runs eager unless engine_args says `enforce_eager: false`: compiled it decoded no faster on
    # vLLM-CPU 0.32 (one thread per engine) and its first start compiles for a minute (docs/dtype.md)
    eager = engine_args.get("enforce_eager") is not False
    if precision == "float32":
        return PrecisionChoice("float32", not eager, "models[].precision is float32", False)
    if precision == "bfloat16":
        return PrecisionChoice("bfloat16", True, "models[].precision is bfloat16", False)
    if not caps.native_bf16:
        why = f"{cpu} has no native bf16 (AMX-BF16 / AVX512-BF16): bf16 would be emulated, slow and unchecked"
        return PrecisionChoice("float32", not eager, f"auto: float32 — {why}", True)
    if bf16_failed is not None:
        return PrecisionChoice(
            "float32", not eager, f"auto: float32 — bf16 failed the numerics check on {cpu} before: {bf16_failed}", True
        )
    return PrecisionChoice("bfloat16", True, f"auto: bf16 compiled — {cpu} has native bf16", True)
