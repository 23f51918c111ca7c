"""The `sessions` config section: pins, the state anchor and history compression (docs/sessions.md)."""

from __future__ import annotations

from pydantic import Field, field_validator

from cluster.config.base import StrictModel
from router.sessions.anchor import AnchorRules


class AnchorSection(StrictModel):
    fields: list[str] = Field(
        default_factory=lambda: ["task", "intent", "status", "step", "result"],
        max_length=32,
        description="keys of the latest validated JSON answer kept in the anchor's state",
    )
    max_bytes: int = Field(2048, ge=64, le=65536, description="largest anchor, as JSON bytes")
    max_entities: int = Field(12, ge=0, le=100, description="names and figures kept from recent turns (0: none)")
    task_chars: int = Field(300, ge=0, le=4000, description="the session's first user turn, clipped to this")

    @field_validator("fields")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        if any(not f.strip() or len(f) > 64 for f in value):
            raise ValueError("anchor fields are non-empty JSON keys of at most 64 characters")
        return value

    def rules(self) -> AnchorRules:
        return AnchorRules(tuple(self.fields), self.max_bytes, self.max_entities, self.task_chars)


class CompressSection(StrictModel):
    keep_last: int = Field(4, ge=1, le=64, description="last messages always kept verbatim (the new turn included)")
    summary_tokens: int = Field(128, ge=16, le=4096, description="longest summary of the older turns")
    summariser: str | None = Field(
        None, description="local model alias that writes the summary; null: the request's own model, served locally"
    )
    summary_timeout_s: float = Field(
        15, gt=0, le=300, description="longest wait for the summary; then the start of each turn stands in"
    )


class SessionsSection(StrictModel):
    """Conversation continuity (router/sessions/sessions.py, serve_apps/sessions/turns.py)."""

    enabled: bool = Field(True, description="pin sessions (x-spillover-session, metadata.session_id) to a target")
    ttl_s: float = Field(3600, gt=0, le=30 * 86400, description="a pin unused this long is forgotten")
    max_sessions: int = Field(
        100_000,
        ge=1,
        description="pins kept (evicted per tenant: the least recently used of the tenant holding the most)",
    )
    cache_s: float = Field(
        1.0,
        ge=0,
        le=60,
        description="each gateway replica reuses a pin it read for this long: a switch made by another replica "
        "is seen within it",
    )
    store: bool = Field(
        False,
        description="keep each session's turns here: a request naming its session then sends only its new turns "
        "and the gateway puts the stored ones in front of them",
    )
    history_tokens: int = Field(3000, ge=0, le=1_000_000, description="most stored tokens put in front of a turn")
    history_max_bytes: int = Field(
        65536, ge=1024, le=16 * 1024 * 1024, description="stored history per session (newest kept), as JSON bytes"
    )
    history_total_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024 * 1024,
        description="stored history of all sessions (evicted per tenant: the least recently used session of the "
        "tenant holding the most bytes)",
    )
    anchor: AnchorSection = Field(AnchorSection(), description="the state carried to a new target on a switch")
    compress: CompressSection = Field(
        CompressSection(), description="summarising older turns when the history does not fit the new target"
    )
