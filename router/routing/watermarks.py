"""The pressure thresholds a replica is judged by (router/routing/saturation.py, router/routing/burst.py).

A config section (`watermarks:` and `models[].watermarks`, cluster/config/deployment.py) defined here, in the
router layer that reads it, so the router needs nothing from the cluster layer.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from router.settings_base import StrictModel


class Watermarks(StrictModel):
    """Pressure thresholds (fractions 0..1 except `queue`, a count of waiting requests)."""

    kv_cache: float = Field(0.85, gt=0, le=1, description="KV-cache usage above which a replica is saturated")
    gpu_memory: float = Field(
        0.95,
        gt=0,
        le=1,
        description="GPU memory pressure reaches 1.0 when free memory falls to (1 - this) of the device, "
        "with the engine holding its reservation; must exceed the engine's gpu_memory_utilization",
    )
    queue: int = Field(8, ge=1, description="waiting requests at which a replica is saturated")
    low: float = Field(
        0.75,
        gt=0,
        le=1,
        description="hysteresis: a saturated replica takes work again only below saturation low / kv_cache",
    )

    @model_validator(mode="after")
    def _low_below_high(self) -> Watermarks:
        if self.low >= min(self.kv_cache, self.gpu_memory):
            raise ValueError("low must be below kv_cache and gpu_memory watermarks")
        return self
