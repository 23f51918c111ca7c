"""Routing policy as data: business scenarios and scoring weights, with a version.

A client names its scenario with the `x-business-scenario` header (declared by the
client, never inferred from the prompt). The scenario fixes the sensitivity level, the strategy
whose weights rank the candidates, which targets and regions are allowed, and hard ceilings.
Request headers may only narrow these (router/request/contract.py).

    level     L1 strong contract: output must match its schema (violations retry the next
              candidate or fail), only on_prem / no_retention targets
              L2 weak contract: violations pass with a warning header
              L3 no contract: output passes unchecked
    strategy  quality | cost | latency: which row of `weights` scores candidates

Every decision record quotes `Policy.version`; publish a new version for every change.
No imports from `cluster`: `cluster.config.deployment.SpilloverConfig` embeds `Policy`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from router.settings_base import StrictModel

Level = Literal["L1", "L2", "L3"]
Strategy = Literal["quality", "cost", "latency"]
SwitchRule = Literal["never", "on_failure", "free"]  # router/sessions/sessions.py
RouteOrder = Literal["route", "strategy"]
LEVELS: tuple[Level, ...] = ("L1", "L2", "L3")  # strictest first
STRATEGIES: tuple[Strategy, ...] = ("quality", "cost", "latency")
SCORER_NAMES = ("quality", "cost", "latency", "locality")  # the scorers of router/routing/scorers.py

DEFAULT_WEIGHTS: dict[Strategy, dict[str, float]] = {
    "quality": {"quality": 0.6, "latency": 0.15, "cost": 0.15, "locality": 0.1},
    "cost": {"cost": 0.6, "quality": 0.2, "latency": 0.1, "locality": 0.1},
    "latency": {"latency": 0.6, "quality": 0.2, "cost": 0.1, "locality": 0.1},
}


class Scenario(StrictModel):
    level: Level = Field(
        "L2",
        description="sensitivity: L1 the output must validate and only on_prem / no_retention targets; L2 a "
        "violation passes with x-spillover-contract; L3 unchecked",
    )
    strategy: Strategy = Field("quality", description="the row of policy.weights that ranks the candidates")
    route_order: RouteOrder = Field(
        "route",
        description="how a route's targets are ordered (docs/routing.md#routes): route, the order the route lists "
        "them; strategy, ranked by this scenario's strategy like a local model's burst targets",
    )
    allowed_targets: list[str] = Field(
        default_factory=lambda: ["*"], min_length=1, description="glob patterns over target ids, e.g. cloud:openai/*"
    )
    residency: Literal["any", "local_only"] | list[str] = Field(
        "any", description="any, local_only, or the regions data may be processed in"
    )
    max_cost_usd: float | None = Field(None, gt=0, description="estimated cost ceiling per request")
    deadline_ms: int | None = Field(
        None, ge=1, description="longest wait for local room, and no retry after it; null: admission.queue_timeout_s"
    )
    quality_floor: float = Field(0, ge=0, le=1, description="targets of a lower configured quality are removed")
    priority: Literal["core", "non_core"] = Field(
        "core",
        description="degradation tier: under shortage non_core requests are deferred (202 + ticket) or shed "
        "first, core ones keep the waiting room and fail as before (router/resilience/tiers.py)",
    )
    continue_streams: bool | None = Field(
        None,
        description="a text stream that breaks after its first byte is continued on the next target that accepts "
        "an assistant prefill, spliced into the same response (never tool calls or checked JSON answers); null: on "
        "for L2 and L3 (the answer's last chunk says it was continued), off for L1",
    )

    def continues_streams(self, level: Level) -> bool:
        """Whether a broken text stream of this scenario, at the request's `level`, is continued."""
        if level == "L1" and self.level != "L1":
            return False  # a header made the request stricter than its scenario: never looser than L1's default
        return self.continue_streams if self.continue_streams is not None else level != "L1"

    switch: SwitchRule = Field(
        "on_failure",
        description="when a session may leave the target it is pinned to: never (wait for it, or 429/503), "
        "on_failure (only its health, breaker or capacity move it) or free (every turn is routed on its own)",
    )

    @field_validator("allowed_targets")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        if any(not p.strip() for p in value):
            raise ValueError("target patterns must be non-empty")
        return value

    @field_validator("residency")
    @classmethod
    def _regions(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list):
            if not value or any(not r.strip() for r in value):
                raise ValueError("a region list must name at least one non-empty region")
            if {"any", "local_only"} & set(value):
                raise ValueError("any / local_only are not regions: give them as a plain string")
        return value


class Policy(StrictModel):
    version: str = Field("1", min_length=1, description="quoted in every decision record")
    require_scenario: bool = Field(False, description="reject requests without x-business-scenario (400)")
    default_scenario: str | None = Field(None, description="used without the header; null: the one named default")
    scenarios: dict[str, Scenario] = Field(
        default_factory=lambda: {"default": Scenario()},
        min_length=1,
        description="scenarios by x-business-scenario name",
    )
    weights: dict[Strategy, dict[str, float]] = Field(
        default_factory=lambda: {s: dict(w) for s, w in DEFAULT_WEIGHTS.items()},
        description="strategy -> scorer (quality, cost, latency, locality) -> weight; a strategy left out keeps its "
        "built-in row",
    )

    @field_validator("scenarios")
    @classmethod
    def _scenario_names(cls, value: dict[str, Scenario]) -> dict[str, Scenario]:
        bad = sorted(n for n in value if not n or not n.replace("_", "").replace("-", "").isalnum())
        if bad:
            raise ValueError(f"scenario names must be letters, digits, - and _: {bad}")
        return value

    @field_validator("weights")
    @classmethod
    def _weights(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        merged = {s: dict(w) for s, w in DEFAULT_WEIGHTS.items()} | {s: dict(w) for s, w in value.items()}
        for strategy, row in merged.items():
            unknown = sorted(set(row) - set(SCORER_NAMES))
            if unknown:
                raise ValueError(f"{strategy}: unknown scorers {unknown}; known: {list(SCORER_NAMES)}")
            if any(w < 0 for w in row.values()):
                raise ValueError(f"{strategy}: weights must be >= 0")
            if not any(w > 0 for w in row.values()):
                raise ValueError(f"{strategy}: at least one weight must be > 0")
        return merged

    @model_validator(mode="after")
    def _default_exists(self) -> Policy:
        known = sorted(self.scenarios)
        if self.default_scenario is not None and self.default_scenario not in self.scenarios:
            raise ValueError(f"default_scenario {self.default_scenario!r} is not among the scenarios {known}")
        if not self.require_scenario and self.default_name is None:
            raise ValueError(
                f"requests without x-business-scenario need a default: set default_scenario (one of {known}), "
                "name a scenario 'default', or set require_scenario: true"
            )
        return self

    @property
    def default_name(self) -> str | None:
        """The scenario of a request without the header (None: the header is required)."""
        if self.default_scenario is not None:
            return self.default_scenario
        return "default" if "default" in self.scenarios else None

    def weights_for(self, strategy: Strategy) -> dict[str, float]:
        return self.weights[strategy]
