"""The `cloud:` section: the cloud APIs requests may burst to (cluster/config/deployment.py holds the rest)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from cluster.config.base import FieldProblems, StrictModel, is_loopback, no_duplicates
from cluster.config.resilience import ProviderProbe
from router.routing.capabilities import ProviderModelEntry

DEFAULT_MAX_REPLY_BYTES = 32 * 1024 * 1024  # a provider reply read whole (body) or in total (stream)


class CloudProvider(StrictModel):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", description="the provider in target ids: cloud:<name>")
    type: Literal["openai", "anthropic"] = Field(
        "openai",
        description="the API it speaks: openai (OpenAI-compatible chat completions) or anthropic (the Anthropic "
        "Messages API, translated by serve_apps/providers/anthropic.py)",
    )
    base_url: str = Field(
        pattern=r"^https?://",
        description="base URL of its API, e.g. .../v1 (chat/completions or, for type anthropic, messages below it); "
        "https:// unless the host is loopback or allow_insecure_http is true",
    )
    allow_insecure_http: bool = Field(
        False,
        description="allow an http:// base_url to a host that is not loopback: the API key and every prompt "
        "then cross the network in clear text (only for a network you trust, e.g. a TLS-adding sidecar)",
    )
    max_reply_bytes: int = Field(
        DEFAULT_MAX_REPLY_BYTES,
        ge=64 * 1024,
        description="most bytes read of one reply (a whole body, or a whole stream, events included); past it the "
        "reply is dropped as 502 provider_reply_too_large and the request fails over (a stream the client already "
        "reads ends with that error event)",
    )
    api_key_env: str | None = Field(
        None, description="environment variable holding the API key (read at call time, never logged)"
    )
    enabled: bool = Field(True, description="false: configured but never sent a request")
    timeout_s: float = Field(60, gt=0, description="seconds a request to this provider may take")
    domain: str | None = Field(
        None, description="failure domain (endpoint / credential pool) shared with other providers; null: its name"
    )
    rpm: int | None = Field(
        None,
        ge=1,
        description="requests per minute all gateway replicas together may send (the provider's limit, counted in "
        "the state store whatever the number of replicas); null: unlimited",
    )
    tpm: int | None = Field(
        None,
        ge=1,
        description="tokens per minute all gateway replicas together may send (counted in the state store: "
        "estimated prompt + max_tokens, settled with the real usage); null: unlimited",
    )
    models: dict[str, ProviderModelEntry] = Field(
        default_factory=dict,
        description="model key -> provider model, the key being a models[] alias (its burst target) or named by a "
        "route as cloud:<provider>/<key>: a bare name means capabilities unknown (never routed there; "
        "capabilities are never inferred from names), or its capabilities",
    )
    probe: ProviderProbe = Field(
        ProviderProbe(),
        description="the latency probe's chat (to the first model of `models`); a probe the provider rejects "
        "as a client error (a 4xx other than 401/403/408/429) is logged and changes no health",
    )

    @property
    def failure_domain(self) -> str:
        return self.domain or self.name

    @model_validator(mode="after")
    def _anthropic_entries(self) -> CloudProvider:
        if self.type == "anthropic":
            structured = sorted(a for a, m in self.models.items() if not isinstance(m, str) and m.json_schema)
            if structured:
                raise ValueError(
                    f"models {', '.join(structured)}: json_schema: true on a type anthropic provider; its adapter "
                    "does not translate response_format, so set json_schema: false"
                )
            legacy = sorted(a for a, m in self.models.items() if not isinstance(m, str) and m.completions)
            if legacy:
                raise ValueError(
                    f"models {', '.join(legacy)}: completions: true on a type anthropic provider; the Messages API "
                    "has no completions API, so set completions: false"
                )
        return self


def insecure_base_url(provider: CloudProvider) -> str | None:
    """Why the provider's base_url is refused (plain http to a host that is not loopback), else None."""
    parts = urlsplit(provider.base_url)
    if parts.scheme.lower() == "https" or provider.allow_insecure_http:
        return None
    try:
        host = parts.hostname or ""
    except ValueError:
        host = ""
    if is_loopback(host):
        return None
    return (
        f"{provider.base_url[:100]!r} is plain http to a host that is not loopback: the API key and every prompt "
        "would cross the network in clear text. Fix: use https://, or set allow_insecure_http: true on this "
        "provider for a network you trust"
    )


class CloudSection(StrictModel):
    providers: list[CloudProvider] = Field(
        default_factory=list, description="OpenAI-compatible cloud APIs requests may burst to"
    )

    @field_validator("providers")
    @classmethod
    def _unique(cls, value: list[CloudProvider]) -> list[CloudProvider]:
        no_duplicates([p.name for p in value], "provider names")
        return value

    @model_validator(mode="after")
    def _https_base_urls(self) -> CloudSection:
        problems = [
            (f"cloud.providers[{i}].base_url", why)
            for i, provider in enumerate(self.providers)
            if (why := insecure_base_url(provider)) is not None
        ]
        if problems:
            raise FieldProblems(problems)
        return self
