"""A served model as `GET /v1/models` lists it (an OpenAI model card with spillover's metadata)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServedModel:
    alias: str
    family: str
    accelerator: str
    max_model_len: int | None
    synthetic: bool = False

    def card(self, created: int) -> dict[str, Any]:
        return {
            "id": self.alias,
            "object": "model",
            "created": created,
            "owned_by": "spillover",
            "metadata": {
                "family": self.family,
                "accelerator": self.accelerator,
                "max_model_len": self.max_model_len,
                "synthetic": self.synthetic,
                "route": "local",
            },
        }


@dataclass(frozen=True)
class ServedRoute:
    """A configured route (`routes:`) as `GET /v1/models` lists it: its targets in fall-over order."""

    alias: str
    targets: tuple[str, ...]

    def card(self, created: int) -> dict[str, Any]:
        return {
            "id": self.alias,
            "object": "model",
            "created": created,
            "owned_by": "spillover",
            "metadata": {"route": "route", "targets": list(self.targets)},
        }
