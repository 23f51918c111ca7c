"""The base of every settings schema: unknown keys are errors and validated settings are frozen.

The router's state machines take their settings as these models, and the config file's sections
(cluster/) are the same classes or extend them, so each setting's default, bounds and description are
written once.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
