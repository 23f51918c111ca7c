"""The `learning` section: per-bucket quality from outcomes, the feedback API, request typing."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from cluster.config.base import StrictModel, compiled_or_none
from router.routing.policy import Policy

NAME = r"^[A-Za-z0-9_-]{1,64}$"


class QualitySection(StrictModel):
    enabled: bool = Field(
        True, description="learn per-bucket quality from outcomes and feedback; the quality scorer uses it"
    )
    min_samples: int = Field(
        20, ge=1, description="samples a (target, bucket) needs before its learned quality replaces the configured one"
    )
    prior_strength: float = Field(
        10, ge=0, description="pseudo-samples of the Beta prior centred on the configured quality (more: slower moves)"
    )
    max_buckets: int = Field(2000, ge=1, description="(target, bucket) pairs kept per gateway replica, oldest dropped")
    latency_window: int = Field(200, ge=1, description="latency samples kept per (target, bucket) for its percentiles")
    max_feedback_per_tenant: float = Field(
        10,
        gt=0,
        description="most samples one tenant's feedback counts for in a (target, bucket), however many reports it "
        "sent: more are scaled down to this weight, so no tenant's volume dominates",
    )


class FeedbackSection(StrictModel):
    max_entries: int = Field(10000, ge=1, description="feedback reports kept per gateway replica, oldest dropped")
    per_tenant_per_minute: float = Field(
        60,
        ge=1,
        allow_inf_nan=False,
        description="feedback reports one tenant may post per minute per gateway replica (a token bucket); over "
        "it: 429 feedback_rate_limited with Retry-After",
    )


class TypingRule(StrictModel):
    scenario: str = Field(pattern=NAME, description="the scenario a matching request gets")
    pattern: str | None = Field(
        None, max_length=500, description="a Python regular expression searched in the request's last user text"
    )
    keywords: list[str] = Field(
        default_factory=list, description="any of these words (case-insensitive) in the last user text matches"
    )
    tenants: list[str] | None = Field(None, description="only requests of these tenants; null: any tenant")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        return compiled_or_none(value)

    @model_validator(mode="after")
    def _matches_something(self) -> TypingRule:
        if self.pattern is None and not self.keywords and self.tenants is None:
            raise ValueError("a rule needs a pattern, keywords or tenants")
        return self


class TypingSection(StrictModel):
    enabled: bool = Field(
        False,
        description="type requests that declare no x-business-scenario (rules first, then the classifier); a "
        "declared scenario always wins, and a typed scenario looser than the default one is not used",
    )
    rules: list[TypingRule] = Field(default_factory=list, description="tried in order; the first match wins")
    examples: dict[str, list[str]] = Field(
        default_factory=dict, description="scenario -> example prompts; their embeddings' centroid types requests"
    )
    min_similarity: float = Field(
        0.35, ge=-1, le=1, description="below this cosine similarity to every centroid: the default scenario"
    )
    max_examples: int = Field(200, ge=1, description="examples kept per scenario (configured and from feedback)")


class PoolSection(StrictModel):
    enabled: bool = Field(
        True,
        description="with a shared store (state.url), every gateway replica learns from every replica's traffic: "
        "quality evidence and feedback, live health scores and graded-switch gates (serve_apps/learning/"
        "pooled_evidence.py); off: each replica learns from its own traffic only",
    )
    period_s: float = Field(
        1.0, gt=0, le=60, description="how often a replica sends what it learnt and reads the others' (seconds)"
    )
    max_events: int = Field(
        20000,
        ge=100,
        le=1_000_000,
        description="evidence kept in the store's log; a replica that starts reads it all, so it does not start "
        "from the configured priors",
    )
    live_horizon_s: float = Field(
        60,
        gt=0,
        le=3600,
        description="another replica's outcome older than this does not move live health scores or switch gates "
        "(a starting replica replays the quality evidence only)",
    )


class LearningSection(StrictModel):
    quality: QualitySection = Field(QualitySection(), description="per-bucket quality (router/learning/quality.py)")
    pool: PoolSection = Field(PoolSection(), description="learning pooled across gateway replicas")
    feedback: FeedbackSection = Field(FeedbackSection(), description="POST /v1/spillover/feedback")
    typing: TypingSection = Field(TypingSection(), description="request typing (router/request/typing_rules.py)")

    def unknown_scenarios(self, policy: Policy) -> list[str]:
        named = {r.scenario for r in self.typing.rules} | set(self.typing.examples)
        return sorted(named - set(policy.scenarios))
