"""The capability registry: configured facts only, unknowns explicit, never inferred from names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from cluster.config.deployment import parse_config
from router.routing.capabilities import (
    ProviderModel,
    ProviderModelEntry,
    Registry,
    cloud_capabilities,
    cloud_target,
    estimate_cost_usd,
    local_capabilities,
    local_target,
    provider_model_name,
)

GPT = ProviderModel(
    name="gpt-4o-mini",
    snapshot="gpt-4o-mini-2024-07-18",
    context_window=128000,
    max_output_tokens=16384,
    tools=True,
    parallel_tool_calls=True,
    json_schema=True,
    modalities=["text", "image"],
    region="us",
    data_policy="no_retention",
    price_in_per_mtok=0.15,
    price_out_per_mtok=0.6,
    quality=0.7,
    expected_latency_ms=800,
)


def test_provider_model_minimal_defaults() -> None:
    m = ProviderModel(name="m", snapshot="m-1", context_window=8192, region="eu")
    assert (m.tools, m.parallel_tool_calls, m.json_schema, m.streaming) == (False, False, False, True)
    assert (m.modalities, m.data_policy, m.quality) == (["text"], "retention", 0.5)
    assert (m.price_in_per_mtok, m.price_out_per_mtok, m.expected_latency_ms) == (None, None, None)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"colour": "red"}, "Extra inputs are not permitted"),
        ({"parallel_tool_calls": True}, "parallel_tool_calls requires tools"),
        ({"modalities": ["image"]}, "modalities must include text"),
        ({"modalities": ["audio"]}, "Input should be 'text' or 'image'"),
        ({"max_output_tokens": 9000}, "must not exceed context_window"),
        ({"quality": 1.5}, "less than or equal to 1"),
        ({"price_in_per_mtok": -1}, "greater than or equal to 0"),
        ({"context_window": 0}, "greater than or equal to 1"),
        ({"data_policy": "forever"}, "on_prem"),
    ],
)
def test_provider_model_rejects(changes: dict[str, Any], fragment: str) -> None:
    data = {"name": "m", "snapshot": "m-1", "context_window": 8192, "region": "eu", **changes}
    with pytest.raises(ValidationError, match=fragment):
        ProviderModel.model_validate(data)


def test_provider_model_needs_snapshot_and_region() -> None:
    with pytest.raises(ValidationError) as caught:
        ProviderModel.model_validate({"name": "m", "context_window": 8192})
    assert {e["loc"][0] for e in caught.value.errors()} == {"snapshot", "region"}


@pytest.mark.parametrize(
    ("engine_args", "tools", "context_window"),
    [
        ({"max_model_len": 4096}, False, 4096),
        ({}, False, 0),
        ({"max_model_len": 4096, "enable_auto_tool_choice": True}, False, 4096),
        ({"max_model_len": 4096, "tool_call_parser": "hermes"}, False, 4096),
        ({"max_model_len": 4096, "enable_auto_tool_choice": True, "tool_call_parser": "hermes"}, True, 4096),
        ({"max_model_len": 4096, "enable_auto_tool_choice": "yes", "tool_call_parser": "hermes"}, False, 4096),
    ],
)
def test_local_capabilities(engine_args: dict[str, Any], tools: bool, context_window: int) -> None:
    caps = local_capabilities("qwen", engine_args)
    assert (caps.tools, caps.context_window) == (tools, context_window)
    assert caps.parallel_tool_calls is False
    assert (caps.json_schema, caps.streaming, caps.modalities) == (True, True, frozenset({"text"}))
    assert (caps.data_policy, caps.region, caps.price_in_per_mtok, caps.price_out_per_mtok) == (
        "on_prem",
        "local",
        0,
        0,
    )
    assert caps.known and caps.snapshot == "qwen"


def test_local_parallel_tools_only_with_tools() -> None:
    assert local_capabilities("q", {}, parallel_tool_calls=True).parallel_tool_calls is False
    args = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
    assert local_capabilities("q", args, parallel_tool_calls=True).parallel_tool_calls is True


def test_cloud_bare_string_is_unknown_even_with_a_telling_name() -> None:
    caps = cloud_capabilities("openai", "qwen", "gpt-4o-128k-tools-vision")
    assert not caps.known
    assert (caps.tools, caps.json_schema, caps.streaming, caps.context_window) == (False, False, False, 0)
    assert caps.price_in_per_mtok is None
    target = cloud_target("openai", "qwen", "gpt-4o-128k-tools-vision")
    assert (target.id, target.provider_model, target.known) == ("cloud:openai/qwen", "gpt-4o-128k-tools-vision", False)


def test_cloud_provider_model_capabilities() -> None:
    target = cloud_target("openai", "qwen", GPT)
    assert (target.id, target.kind, target.provider, target.alias) == ("cloud:openai/qwen", "cloud", "openai", "qwen")
    assert target.provider_model == "gpt-4o-mini" == provider_model_name(GPT)
    assert target.caps.modalities == frozenset({"text", "image"})
    assert target.caps.snapshot == "gpt-4o-mini-2024-07-18"
    assert target.known


def test_estimate_cost() -> None:
    caps = cloud_target("openai", "qwen", GPT).caps
    assert estimate_cost_usd(caps, 1_000_000, 0) == pytest.approx(0.15)
    assert estimate_cost_usd(caps, 1000, 500) == pytest.approx((1000 * 0.15 + 500 * 0.6) / 1e6)
    assert estimate_cost_usd(cloud_target("x", "qwen", "name").caps, 1, 1) is None
    assert estimate_cost_usd(local_target("qwen", {}).caps, 10_000, 10_000) == 0


@dataclass
class _Spec:
    alias: str
    engine_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Provider:
    name: str
    models: dict[str, Any]
    enabled: bool = True


def test_registry_from_config_like_objects() -> None:
    registry = Registry.from_config(
        [_Spec("qwen", {"max_model_len": 8192}), _Spec("llama")],
        [_Provider("openai", {"qwen": GPT, "llama": "gpt-4o"}), _Provider("off", {"qwen": GPT}, enabled=False)],
        local_quality={"qwen": 0.8},
    )
    assert [t.id for t in registry.targets] == ["local:qwen", "local:llama", "cloud:openai/qwen", "cloud:openai/llama"]
    assert [t.id for t in registry.for_alias("qwen")] == ["local:qwen", "cloud:openai/qwen"]
    assert registry.for_alias("nope") == ()
    assert registry.get("local:qwen").caps.quality == 0.8  # type: ignore[union-attr]
    assert registry.get("local:llama").caps.quality == 0.5  # type: ignore[union-attr]
    assert registry.get("cloud:openai/llama").known is False  # type: ignore[union-attr]
    assert registry.get("cloud:off/qwen") is None


def test_registry_from_the_real_config_models() -> None:
    config = parse_config(
        {
            "models": [{"alias": "qwen", "source": "x", "family": "qwen", "engine_args": {"max_model_len": 4096}}],
            "cloud": {"providers": [{"name": "sim", "base_url": "https://h/v1", "models": {"qwen": "sim-qwen"}}]},
        },
        "test",
    )
    registry = Registry.from_config(config.models, config.cloud.providers)
    assert [(t.id, t.known) for t in registry.targets] == [("local:qwen", True), ("cloud:sim/qwen", False)]


def test_registry_rejects_duplicate_ids() -> None:
    with pytest.raises(ValueError, match="duplicate target ids"):
        Registry((local_target("q", {}), local_target("q", {})))


class _ProviderSection(BaseModel):
    """How cluster.config.cloud.CloudProvider is meant to embed entries."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    models: dict[str, ProviderModelEntry] = {}


def test_provider_model_entry_in_a_config_model() -> None:
    data = {"models": {"a": "gpt-4o", "b": GPT.model_dump(mode="json")}}
    section = _ProviderSection.model_validate(data)
    assert section.models == {"a": "gpt-4o", "b": GPT}
    assert _ProviderSection.model_validate(section.model_dump(mode="json")) == section
    with pytest.raises(ValidationError) as caught:
        _ProviderSection.model_validate({"models": {"b": {"name": "m", "context_window": 1, "region": "x", "tols": 1}}})
    assert [(e["loc"], e["msg"]) for e in caught.value.errors()] == [
        (("models", "b", "capabilities", "snapshot"), "Field required"),
        (("models", "b", "capabilities", "tols"), "Extra inputs are not permitted"),
    ]
