"""The `x-*` request headers of a contract, and how they narrow a scenario (never widen it).

    x-business-scenario        a scenario of the policy; missing → the policy's default, or 400
                               `scenario_required` when the policy requires it; unknown → 400
                               `unknown_scenario` naming the known ones
    x-spillover-level          L1 | L2 | L3            → the stricter of scenario and header (L1 strictest)
    x-spillover-residency      any | local_only | comma list of regions
                                                       → intersection with the scenario's residency:
                                                         local_only wins over anything; two region lists
                                                         intersect (an empty intersection allows no cloud
                                                         or local region, and the residency filter says so);
                                                         `any` takes the other side
    x-spillover-providers      comma list of cloud providers → intersection (the scenario has none: header)
    x-spillover-max-cost-usd   float > 0               → min(scenario, header)
    x-spillover-deadline-ms    integer > 0             → min(scenario, header)

A malformed value raises `InvalidRequest` with `param` = the header name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

from router import headers as hdr
from router.error_codes import ErrorCode
from router.errors import InvalidRequest
from router.routing.policy import LEVELS, Level, Policy, Scenario

SCENARIO_HEADER = hdr.SCENARIO
LEVEL_HEADER = hdr.LEVEL
RESIDENCY_HEADER = hdr.RESIDENCY
PROVIDERS_HEADER = hdr.PROVIDERS
MAX_COST_HEADER = hdr.MAX_COST
DEADLINE_HEADER = hdr.DEADLINE
CONTRACT_HEADERS = frozenset(
    {SCENARIO_HEADER, LEVEL_HEADER, RESIDENCY_HEADER, PROVIDERS_HEADER, MAX_COST_HEADER, DEADLINE_HEADER}
)

Residency = Literal["any", "local_only"] | frozenset[str]


def lower_keys(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def resolve_scenario(headers: Mapping[str, str], policy: Policy) -> tuple[str, Scenario]:
    """`headers` with lower-case keys."""
    raw = headers.get(SCENARIO_HEADER)
    name = raw.strip() if raw is not None else ""
    known = ", ".join(sorted(policy.scenarios))
    if not name:
        default = policy.default_name
        if policy.require_scenario or default is None:
            raise InvalidRequest(
                f"header {SCENARIO_HEADER} is required; known scenarios: {known}",
                param=SCENARIO_HEADER,
                code=ErrorCode.SCENARIO_REQUIRED,
            )
        return default, policy.scenarios[default]
    scenario = policy.scenarios.get(name)
    if scenario is None:
        raise InvalidRequest(
            f"unknown scenario {name!r} in {SCENARIO_HEADER}; known scenarios: {known}",
            param=SCENARIO_HEADER,
            code=ErrorCode.UNKNOWN_SCENARIO,
        )
    return name, scenario


def stricter_level(scenario_level: Level, header: str | None) -> Level:
    if header is None:
        return scenario_level
    value = header.strip().upper()
    if value not in LEVELS:
        raise InvalidRequest(
            f"header {LEVEL_HEADER} must be one of {', '.join(LEVELS)}, not {header!r}", param=LEVEL_HEADER
        )
    return min(scenario_level, value, key=LEVELS.index)


def _comma_list(header_name: str, raw: str) -> frozenset[str]:
    items = [p.strip() for p in raw.split(",")]
    if not items or any(not p for p in items):
        raise InvalidRequest(f"header {header_name} must be a comma-separated list of names", param=header_name)
    return frozenset(items)


def parse_residency(raw: str | None) -> Residency:
    if raw is None or not raw.strip():
        return "any"
    value = raw.strip()
    if value.lower() in ("any", "local_only"):
        return value.lower()  # type: ignore[return-value]
    regions = _comma_list(RESIDENCY_HEADER, value)
    if regions & {"any", "local_only"}:
        raise InvalidRequest(
            f"header {RESIDENCY_HEADER} must be any, local_only or a list of regions, not {raw!r}",
            param=RESIDENCY_HEADER,
        )
    return regions


def narrow_residency(scenario: Residency, header: Residency) -> Residency:
    if scenario == "local_only" or header == "local_only":
        return "local_only"
    if scenario == "any":
        return header
    if header == "any":
        return scenario
    return scenario & header


def scenario_residency(scenario: Scenario) -> Residency:
    value = scenario.residency
    return frozenset(value) if isinstance(value, list) else value


def parse_providers(raw: str | None) -> frozenset[str] | None:
    return None if raw is None else _comma_list(PROVIDERS_HEADER, raw)


def _positive(header_name: str, raw: str, kind: type[int] | type[float]) -> float:
    try:
        value = kind(raw.strip())
        finite = math.isfinite(value)
    except (ValueError, OverflowError):  # not a number, or an integer too large for a float
        value, finite = -1, False
    if not finite or value <= 0:
        what = "a positive integer (milliseconds)" if kind is int else "a positive number (USD)"
        raise InvalidRequest(f"header {header_name} must be {what}, not {raw!r}", param=header_name)
    return value


def narrowed_min(scenario_value: float | None, header_name: str, raw: str | None, kind: type) -> float | None:
    """min(scenario, header); either may be absent."""
    if raw is None:
        return scenario_value
    value = _positive(header_name, raw, kind)
    return value if scenario_value is None else min(scenario_value, value)
