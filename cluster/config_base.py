"""The base of every config section: unknown keys are errors and a validated config is frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def no_duplicates(names: list[str], what: str) -> None:
    """ValueError naming the names that appear more than once."""
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate {what}: {', '.join(dupes)}")
