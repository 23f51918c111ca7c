"""What each routing target CAN do: the capability registry, per provider + model snapshot.

A target is one place a request for a model alias can run:

    local:<alias>                 the alias served by the cluster's own vLLM replicas
    cloud:<provider>/<alias>      the alias mapped to a model of a configured cloud provider

Capabilities come from configuration (official documentation, probes), never from model names:
a cloud entry given as a bare string (`models: {qwen-7b: gpt-4o-mini}`) has UNKNOWN capabilities,
every one of them treated as not supported, and the `capabilities_known` filter removes it with
"capabilities unknown (configure them; never inferred from the model name)". Give a
`ProviderModel` mapping instead to make it eligible.

Unknowns are explicit: `context_window == 0` means unknown (a local model without
`engine_args.max_model_len`), `price_*_per_mtok is None` means unpriced (a cost ceiling removes
such a cloud target), `expected_latency_ms is None` means no expectation (the latency scorer is neutral).

No imports from `cluster`: `cluster.config.cloud` embeds `ProviderModel` in `CloudProvider.models`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol

from pydantic import Discriminator, Field, Tag, model_validator

from router.settings_base import StrictModel

Modality = Literal["text", "image"]
DataPolicy = Literal["on_prem", "no_retention", "retention"]
TargetKind = Literal["local", "cloud"]


class ProviderModel(StrictModel):
    """One cloud model snapshot and what it supports, as configured (unknown keys are errors)."""

    name: str = Field(min_length=1, description="the provider's model id, sent as `model`")
    snapshot: str = Field(min_length=1, description="pinned version id, e.g. gpt-4o-mini-2024-07-18")
    context_window: int = Field(ge=1, description="prompt + output tokens the model accepts")
    max_output_tokens: int | None = Field(None, ge=1, description="largest max_tokens it accepts; null: the window")
    tools: bool = Field(False, description="tool calling")
    parallel_tool_calls: bool = Field(False, description="several tool calls in one answer (needs tools)")
    json_schema: bool = Field(False, description="response_format json_schema (structured outputs)")
    streaming: bool = Field(True, description="SSE streaming")
    prefill: bool = Field(
        False,
        description="continues a trailing assistant message (an OpenAI-compatible vLLM server with "
        "continue_final_message, or the Messages API's prefill): may continue a broken stream",
    )
    completions: bool = Field(
        False, description="the legacy completions API (`POST /completions`): a /v1/completions request may burst here"
    )
    echo: bool = Field(False, description="completions `echo` (the prompt returned before the answer)")
    logprobs: bool = Field(False, description="completions `logprobs` (log-probabilities of the answer's tokens)")
    modalities: list[Modality] = Field(
        default_factory=lambda: list[Modality](["text"]), min_length=1, description="input it accepts; text included"
    )
    region: str = Field(min_length=1, description="where the provider processes the data")
    data_policy: DataPolicy = Field(
        "retention", description="what the provider keeps of the data (L1 allows on_prem and no_retention only)"
    )
    price_in_per_mtok: float | None = Field(None, ge=0, description="USD per 1M prompt tokens; null: unknown")
    price_out_per_mtok: float | None = Field(None, ge=0, description="USD per 1M output tokens; null: unknown")
    quality: float = Field(0.5, ge=0, le=1, description="measured task quality, 0..1")
    expected_latency_ms: int | None = Field(
        None,
        ge=0,
        description="what the ranking's latency scorer expects (live latency moves traffic through the health-score "
        "weight instead); null: unknown",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ProviderModel:
        if self.parallel_tool_calls and not self.tools:
            raise ValueError("parallel_tool_calls requires tools")
        if (self.echo or self.logprobs) and not self.completions:
            raise ValueError("echo and logprobs are completions capabilities: they require completions")
        if "text" not in self.modalities:
            raise ValueError("modalities must include text")
        if self.max_output_tokens is not None and self.max_output_tokens > self.context_window:
            raise ValueError("max_output_tokens must not exceed context_window")
        return self


def _entry_kind(value: Any) -> str:
    return "name" if isinstance(value, str) else "capabilities"


# The type of a `CloudProvider.models` value: a bare provider model name (capabilities unknown) or a
# `ProviderModel`. The discriminator keeps a config error to the branch the user meant:
# `cloud.providers[0].models.qwen.capabilities.snapshot: Field required`, not one error per branch.
ProviderModelEntry = Annotated[
    Annotated[str, Tag("name")] | Annotated[ProviderModel, Tag("capabilities")],
    Discriminator(_entry_kind),
]


@dataclass(frozen=True)
class Capabilities:
    """The same facts as `ProviderModel`, for any target; `known=False` means none were configured."""

    snapshot: str
    context_window: int  # 0: unknown
    max_output_tokens: int | None
    tools: bool
    parallel_tool_calls: bool
    json_schema: bool
    streaming: bool
    modalities: frozenset[str]
    region: str
    data_policy: DataPolicy
    price_in_per_mtok: float | None
    price_out_per_mtok: float | None
    quality: float
    expected_latency_ms: int | None
    known: bool = True
    prefill: bool = False  # continues a trailing assistant message (stream continuation)
    completions: bool = False  # serves the legacy completions API (/v1/completions)
    echo: bool = False  # completions `echo`
    logprobs: bool = False  # completions `logprobs`


def unknown_capabilities(snapshot: str = "unknown") -> Capabilities:
    """Nothing configured: every capability treated as not supported, prices and region unknown."""
    return Capabilities(
        snapshot=snapshot,
        context_window=0,
        max_output_tokens=None,
        tools=False,
        parallel_tool_calls=False,
        json_schema=False,
        streaming=False,
        modalities=frozenset({"text"}),
        region="unknown",
        data_policy="retention",
        price_in_per_mtok=None,
        price_out_per_mtok=None,
        quality=0.0,
        expected_latency_ms=None,
        known=False,
    )


def estimate_cost_usd(caps: Capabilities, prompt_tokens: int, output_tokens: int) -> float | None:
    """prompt × price_in + output × price_out, per 1M tokens; None when a price is unknown."""
    if caps.price_in_per_mtok is None or caps.price_out_per_mtok is None:
        return None
    return (prompt_tokens * caps.price_in_per_mtok + output_tokens * caps.price_out_per_mtok) / 1_000_000


LOCAL_PREFIX = "local:"


def local_id(alias: str) -> str:
    """A local model's one name, `local:<alias>`: its target id, health key and x-spillover-target."""
    return f"{LOCAL_PREFIX}{alias}"


def provider_key(provider: str) -> str:
    """A cloud provider's name, `cloud:<provider>`: its health key and x-spillover-target."""
    return f"cloud:{provider}"


def cloud_id(provider: str, alias: str) -> str:
    """A cloud target's id, `cloud:<provider>/<alias>`: one model at one provider (breakers, quotas
    and decision records are per model; health and the response header per provider)."""
    return f"{provider_key(provider)}/{alias}"


def is_local_id(target_id: str) -> bool:
    return target_id.startswith(LOCAL_PREFIX)


@dataclass(frozen=True)
class Target:
    id: str  # local_id(alias) | cloud_id(provider, alias)
    kind: TargetKind
    provider: str | None  # None for local targets
    alias: str
    provider_model: str  # the model name sent to the backend
    caps: Capabilities

    @property
    def known(self) -> bool:
        return self.caps.known

    @property
    def endpoint(self) -> str:
        """Where it runs, as health and `x-spillover-target` name it: `local:<alias>` | `cloud:<provider>`."""
        return local_id(self.alias) if self.kind == "local" else provider_key(self.provider or "")


def local_capabilities(
    alias: str,
    engine_args: Mapping[str, Any],
    *,
    region: str = "local",
    quality: float = 0.5,
    snapshot: str | None = None,
    parallel_tool_calls: bool = False,
    expected_latency_ms: int | None = None,
) -> Capabilities:
    """A local vLLM model's capabilities, read from its engine args.

    - context window: `max_model_len`; not set → 0 (unknown: the context filter says so and
      removes the target for every request — set max_model_len to route to it)
    - json_schema: always (vLLM structured outputs)
    - tools: only with `enable_auto_tool_choice: true` and a `tool_call_parser`; parallel tool
      calls depend on the parser, so they are off unless the caller says so
    - streaming, text only, data stays on premises, no per-token price
    - prefill: always (vLLM's chat API continues a trailing assistant message with
      `continue_final_message: true, add_generation_prompt: false`)
    - completions, with echo and logprobs: always (vLLM serves /v1/completions)
    """
    max_len = engine_args.get("max_model_len")
    tools = engine_args.get("enable_auto_tool_choice") is True and bool(engine_args.get("tool_call_parser"))
    return Capabilities(
        snapshot=snapshot or alias,
        context_window=max_len if isinstance(max_len, int) and max_len > 0 else 0,
        max_output_tokens=None,
        tools=tools,
        parallel_tool_calls=tools and parallel_tool_calls,
        json_schema=True,
        streaming=True,
        modalities=frozenset({"text"}),
        region=region,
        data_policy="on_prem",
        price_in_per_mtok=0.0,
        price_out_per_mtok=0.0,
        quality=quality,
        expected_latency_ms=expected_latency_ms,
        prefill=True,
        completions=True,
        echo=True,
        logprobs=True,
    )


def provider_model_name(entry: str | ProviderModel) -> str:
    """The model id to send to the provider, for either form of a `CloudProvider.models` entry."""
    return entry if isinstance(entry, str) else entry.name


def cloud_capabilities(provider_name: str, alias: str, entry: str | ProviderModel) -> Capabilities:
    """A cloud entry's capabilities; a bare string gives unknown ones (never inferred from the name)."""
    if isinstance(entry, str):
        return unknown_capabilities(snapshot=entry)
    return Capabilities(
        snapshot=entry.snapshot,
        context_window=entry.context_window,
        max_output_tokens=entry.max_output_tokens,
        tools=entry.tools,
        parallel_tool_calls=entry.parallel_tool_calls,
        json_schema=entry.json_schema,
        streaming=entry.streaming,
        modalities=frozenset(entry.modalities),
        region=entry.region,
        data_policy=entry.data_policy,
        price_in_per_mtok=entry.price_in_per_mtok,
        price_out_per_mtok=entry.price_out_per_mtok,
        quality=entry.quality,
        expected_latency_ms=entry.expected_latency_ms,
        prefill=entry.prefill,
        completions=entry.completions,
        echo=entry.echo,
        logprobs=entry.logprobs,
    )


def local_target(alias: str, engine_args: Mapping[str, Any], **kwargs: Any) -> Target:
    """`kwargs` go to `local_capabilities` (region, quality, snapshot, ...)."""
    return Target(local_id(alias), "local", None, alias, alias, local_capabilities(alias, engine_args, **kwargs))


def cloud_target(provider_name: str, alias: str, entry: str | ProviderModel) -> Target:
    caps = cloud_capabilities(provider_name, alias, entry)
    return Target(cloud_id(provider_name, alias), "cloud", provider_name, alias, provider_model_name(entry), caps)


class ModelSpecLike(Protocol):
    """What `Registry.from_config` reads of `cluster.config.model_spec.ModelSpec`."""

    @property
    def alias(self) -> str: ...

    @property
    def engine_args(self) -> Mapping[str, Any]: ...


class ProviderLike(Protocol):
    """What `Registry.from_config` reads of `cluster.config.cloud.CloudProvider`."""

    @property
    def name(self) -> str: ...

    @property
    def enabled(self) -> bool: ...

    @property
    def models(self) -> Mapping[str, str | ProviderModel]: ...


class RouteLike(Protocol):
    """What `Registry.from_config` reads of `cluster.config.routes.RouteSpec`."""

    @property
    def alias(self) -> str: ...

    @property
    def targets(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class Registry:
    """Every target, local ones first, in config order, and the routes: a route alias -> its target
    ids in fall-over order. Immutable: rebuild it when the config changes."""

    targets: tuple[Target, ...]
    routes: Mapping[str, tuple[str, ...]] = field(default_factory=dict, compare=False)
    _by_id: Mapping[str, Target] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_id = {t.id: t for t in self.targets}
        if len(by_id) != len(self.targets):
            raise ValueError("duplicate target ids in registry")
        object.__setattr__(self, "_by_id", by_id)

    def for_alias(self, alias: str) -> tuple[Target, ...]:
        """The targets a request for `alias` may run on: a route's, in its order (those of disabled
        providers left out), else every target of that model alias."""
        route = self.routes.get(alias)
        if route is not None:
            return tuple(self._by_id[i] for i in route if i in self._by_id)
        return tuple(t for t in self.targets if t.alias == alias)

    def route_order(self, alias: str) -> tuple[str, ...] | None:
        """A route's target ids in its order; None when `alias` is not a route."""
        return self.routes.get(alias)

    def local_model(self, alias: str) -> str:
        """The local model whose replicas, admission and hysteresis serve `alias`: a route's local
        target, else the alias itself (a cloud-only route has no replicas under its name)."""
        route = self.routes.get(alias)
        if route is None:
            return alias
        return next((t.removeprefix(LOCAL_PREFIX) for t in route if is_local_id(t)), alias)

    def get(self, target_id: str) -> Target | None:
        return self._by_id.get(target_id)

    @classmethod
    def from_config(
        cls,
        models: Iterable[ModelSpecLike],
        providers: Iterable[ProviderLike],
        *,
        local_region: str = "local",
        local_quality: Mapping[str, float] | None = None,
        routes: Iterable[RouteLike] = (),
    ) -> Registry:
        """Targets of `config.models` and of the enabled `config.cloud.providers`, and `config.routes`."""
        quality = local_quality or {}
        targets = [
            local_target(m.alias, m.engine_args, region=local_region, quality=quality.get(m.alias, 0.5)) for m in models
        ]
        for provider in providers:
            if provider.enabled:
                targets += [cloud_target(provider.name, alias, entry) for alias, entry in provider.models.items()]
        return cls(tuple(targets), {r.alias: tuple(r.targets) for r in routes})
