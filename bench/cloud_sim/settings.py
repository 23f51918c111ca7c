"""What the cloud simulator is set to do: `SimSettings`, validated by pydantic.

One frozen object holds the served model names, the timing model (time to first token,
token rate), the concurrency capacity, the fault rates and the API key. It is set from the
command line at start and replaced at run time through `POST /control/faults`, which merges
a JSON object into the current settings with `SimSettings.merged`.

Fault rates are fractions of admitted requests; one random draw per request picks at most
one fault, so the rates must add up to at most 1.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from cluster.config.base import compiled_or_none

FAULT_RATE_FIELDS = (
    "error_5xx_rate",
    "rate_limit_rate",
    "timeout_rate",
    "reset_rate",
    "midstream_cut_rate",
    "malformed_rate",
    "schema_invalid_rate",
    "tool_args_invalid_rate",
    "malformed_event_rate",
    "no_done_rate",
)
DEFAULT_MODELS = ("sim-smollm2", "gpt-4o-mini")


class InvalidSettings(ValueError):
    """A settings update failed validation; the message names each field and reason."""


class SimSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    api: Literal["openai", "anthropic"] = Field(
        "openai", description="wire protocol: OpenAI chat completions or the Anthropic Messages API (fixed at start)"
    )
    models: tuple[str, ...] = Field(DEFAULT_MODELS, min_length=1, description="model names served")
    ttft_s: float = Field(0.2, ge=0, le=600, description="time to first token, seconds")
    tokens_per_s: float = Field(100.0, ge=0, description="token rate; 0 means no per-token delay")
    max_concurrency: int = Field(64, ge=0, description="in-flight requests before 429; 0 means unlimited")
    error_5xx_rate: float = Field(0.0, ge=0, le=1, description="fraction answered 500/502/503")
    rate_limit_rate: float = Field(0.0, ge=0, le=1, description="fraction answered 429 + Retry-After")
    retry_after_s: float = Field(1.0, ge=0, le=3600, description="Retry-After sent with every 429")
    timeout_rate: float = Field(0.0, ge=0, le=1, description="fraction that hang for hang_s")
    hang_s: float = Field(30.0, ge=0, le=600, description="how long a timeout fault hangs before a 504")
    reset_rate: float = Field(0.0, ge=0, le=1, description="fraction whose connection is reset before any byte")
    midstream_cut_rate: float = Field(0.0, ge=0, le=1, description="fraction cut off mid-body / mid-stream")
    malformed_rate: float = Field(0.0, ge=0, le=1, description="fraction answered 200 with invalid JSON")
    schema_invalid_rate: float = Field(
        0.0, ge=0, le=1, description="fraction of json_schema answers whose JSON breaks the schema"
    )
    tool_args_invalid_rate: float = Field(
        0.0, ge=0, le=1, description="fraction of tool-call answers whose arguments break the tool's parameters"
    )
    malformed_event_rate: float = Field(
        0.0, ge=0, le=1, description="fraction of streams with one non-JSON event between two token events"
    )
    no_done_rate: float = Field(0.0, ge=0, le=1, description="fraction of streams that end without [DONE]")
    cut_after_tokens: int | None = Field(
        None, ge=1, le=100_000, description="a midstream_cut stream stops after this many token events; null: half"
    )
    context_window: int | None = Field(
        None, ge=1, description="prompt words + max_tokens above this are answered 400 context_length_exceeded"
    )
    accepts_prefill: bool = Field(
        True, description="continue a trailing assistant message (prefill); false: answer such a request 400"
    )
    outage: bool = Field(False, description="every /v1 request (chat and models) is answered 503: the provider is down")
    content_filter: str | None = Field(
        None,
        max_length=200,
        description="case-insensitive regular expression: a chat whose message text matches is answered 400 "
        "`content_filter` (a provider's content policy); null: none",
    )
    rpm_limit: int | None = Field(
        None,
        ge=0,
        le=10**9,
        description="the account's requests a minute: reported in x-ratelimit-* headers, 429 past "
        "it (bench/cloud_sim/provider/account_limits.py); null: off",
    )
    tpm_limit: int | None = Field(None, ge=0, le=10**12, description="the account's tokens a minute, as rpm_limit")
    limit_window_s: float = Field(
        60.0, ge=0.1, le=3600, description="the window rpm_limit and tpm_limit count over (a minute; shorter in tests)"
    )
    api_key: SecretStr | None = Field(None, description="when set, requests need `Authorization: Bearer <key>`")

    @field_validator("models")
    @classmethod
    def _model_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        names = tuple(name.strip() for name in value)
        if any(not name for name in names):
            raise ValueError("model names must not be empty")
        if len(set(names)) != len(names):
            raise ValueError("model names must be unique")
        return names

    @field_validator("content_filter")
    @classmethod
    def _filter_compiles(cls, value: str | None) -> str | None:
        return compiled_or_none(value)

    @field_validator("api_key")
    @classmethod
    def _key_not_blank(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value():
            return None
        return value

    @model_validator(mode="after")
    def _rates_fit(self) -> SimSettings:
        total = sum(getattr(self, name) for name in FAULT_RATE_FIELDS)
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault rates add up to {total:g}; they must add up to at most 1")
        return self

    @property
    def require_api_key(self) -> bool:
        return self.api_key is not None

    def key_matches(self, presented: str) -> bool:
        wanted = self.api_key.get_secret_value() if self.api_key is not None else None
        return wanted is not None and hmac.compare_digest(presented.encode(), wanted.encode())

    def public(self) -> dict[str, Any]:
        """JSON-safe view for `GET /control/faults`: everything but the key itself."""
        data = self.model_dump(mode="json", exclude={"api_key"})
        data["require_api_key"] = self.require_api_key
        return data

    def merged(self, updates: Mapping[str, Any]) -> SimSettings:
        """A copy with `updates` applied (validated as a whole); raises `InvalidSettings`.

        `require_api_key: false` clears the key; `require_api_key: true` needs a key set.
        """
        updates = dict(updates)
        require = updates.pop("require_api_key", None)
        data: dict[str, Any] = {**self.model_dump(), **updates}
        if require is False:
            data["api_key"] = None
        try:
            result = SimSettings.model_validate(data)
        except ValidationError as exc:
            raise InvalidSettings(_describe(exc)) from None
        if require is True and not result.require_api_key:
            raise InvalidSettings("require_api_key: set api_key to require one")
        return result


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(settings)"
        parts.append(f"{field}: {err['msg']}")
    return "; ".join(parts)
