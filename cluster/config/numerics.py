"""`models[].numerics`: how a replica checks that its engine computes the model right
(cluster/precision/numerics_check.py against the reference of cluster/precision/numerics_reference.py)."""

from __future__ import annotations

from pydantic import Field

from cluster.config.base import StrictModel


class NumericsSettings(StrictModel):
    first_tokens: int = Field(
        8, ge=1, le=16, description="leading greedy tokens per reference prompt that must equal the reference's"
    )
    min_agreeing_float32: float = Field(
        1.0, gt=0, le=1, description="share of the reference prompts that must agree when the engine runs float32"
    )
    min_agreeing_bf16: float = Field(
        0.875,
        gt=0,
        le=1,
        description="share that must agree in bfloat16 (a near tie can flip in 8 bits of mantissa; a broken "
        "kernel departs on most prompts: docs/dtype.md has the measured agreement)",
    )
    interval_s: float = Field(
        300, ge=10, description="seconds between checks while the replica serves (off the request path)"
    )
    timeout_s: float = Field(120, gt=0, description="a check that takes longer fails")

    def min_agreeing(self, dtype: str) -> float:
        return self.min_agreeing_bf16 if dtype in ("bfloat16", "bf16", "half", "float16") else self.min_agreeing_float32
