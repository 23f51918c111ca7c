"""The base of every config section: unknown keys are errors and a validated config is frozen
(`StrictModel` lives in router/settings_base.py, where the router's own settings are defined)."""

from __future__ import annotations

import ipaddress
import re

from router.settings_base import StrictModel

__all__ = ["StrictModel", "compiled_or_none", "is_loopback", "no_duplicates"]


def no_duplicates(names: list[str], what: str) -> None:
    """ValueError naming the names that appear more than once."""
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate {what}: {', '.join(dupes)}")


class FieldProblems(ValueError):
    """A model validator's problems with their own field paths (`cluster.config.deployment.parse_config` reports
    each at its path instead of at the top level)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{path}: {reason}" for path, reason in problems))
        self.problems = problems


def compiled_or_none(value: str | None) -> str | None:
    """A config field's regular expression, checked to compile (ValueError saying why); None passes."""
    if value is not None:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
    return value


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback IP address (`127.0.0.0/8`, `::1`); any other name may resolve anywhere."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
