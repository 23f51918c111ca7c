"""Each hard filter: the cases it keeps and the exact reason it gives when it removes a target."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from router.request.contract import RequestContract
from router.routing import filters
from router.routing.capabilities import Capabilities, ProviderModel, Target, cloud_target, local_target
from router.routing.plugins import TargetState
from router.sessions.carried import Label, Origin

CLOUD = cloud_target(
    "openai",
    "qwen",
    ProviderModel(
        name="gpt",
        snapshot="gpt-1",
        context_window=8192,
        max_output_tokens=4096,
        region="us-east",
        price_in_per_mtok=2.5,
        price_out_per_mtok=10,
        quality=0.6,
    ),
)
LOCAL = local_target("qwen", {"max_model_len": 4096})
BARE = cloud_target("openai", "qwen", "gpt-4o")
BASE = RequestContract(model="qwen", scenario="s", level="L2", strategy="quality", est_prompt_tokens=100)


FIRST = Origin("r1", "private", 1)
PRIVATE = Label(level="L1", residency="local_only", origins=(("level", FIRST), ("residency", FIRST)))


def _c(**changes: Any) -> RequestContract:
    return replace(BASE, **changes)


def _t(target: Target, **caps: Any) -> Target:
    new_caps: Capabilities = replace(target.caps, **caps)
    return replace(target, caps=new_caps)


CASES: list[tuple[str, RequestContract, Target, str | None]] = [
    # capabilities_known
    ("capabilities_known", BASE, CLOUD, None),
    ("capabilities_known", BASE, LOCAL, None),
    (
        "capabilities_known",
        BASE,
        BARE,
        "capabilities unknown (configure them; never inferred from the model name)",
    ),
    # allowed_targets
    ("allowed_targets", BASE, CLOUD, None),
    ("allowed_targets", _c(allowed_target_patterns=("local:*", "cloud:openai/*")), CLOUD, None),
    (
        "allowed_targets",
        _c(allowed_target_patterns=("local:*", "cloud:azure/*")),
        CLOUD,
        "not allowed by scenario 's' (allowed_targets: local:*, cloud:azure/*)",
    ),
    ("allowed_targets", _c(allowed_target_patterns=("cloud:*/qwen",)), CLOUD, None),
    (
        "allowed_targets",
        _c(allowed_target_patterns=("Local:*",)),
        LOCAL,
        "not allowed by scenario 's' (allowed_targets: Local:*)",
    ),
    # providers
    ("providers", _c(allowed_providers=frozenset({"openai"})), CLOUD, None),
    ("providers", _c(allowed_providers=frozenset({"azure"})), LOCAL, None),
    (
        "providers",
        _c(allowed_providers=frozenset({"b", "azure"})),
        CLOUD,
        "provider 'openai' not in x-spillover-providers (azure, b)",
    ),
    # residency
    ("residency", BASE, CLOUD, None),
    ("residency", _c(residency="local_only"), LOCAL, None),
    ("residency", _c(residency="local_only"), CLOUD, "residency local_only: the request may not leave the cluster"),
    ("residency", _c(residency=frozenset({"us-east", "eu"})), CLOUD, None),
    (
        "residency",
        _c(residency=frozenset({"eu-west", "eu"})),
        CLOUD,
        "region 'us-east' not in allowed regions (eu, eu-west)",
    ),
    ("residency", _c(residency=frozenset({"eu"})), LOCAL, "region 'local' not in allowed regions (eu)"),
    ("residency", _c(residency=frozenset({"eu"})), _t(LOCAL, region="eu"), None),
    (
        "residency",
        _c(residency=frozenset()),
        CLOUD,
        "region 'us-east' not allowed: the scenario's regions and the header's do not intersect",
    ),
    # data_policy
    ("data_policy", _c(level="L1"), LOCAL, None),
    ("data_policy", _c(level="L1"), _t(CLOUD, data_policy="no_retention"), None),
    (
        "data_policy",
        _c(level="L1"),
        CLOUD,
        "data policy 'retention' not allowed at L1 (needs on_prem or no_retention)",
    ),
    ("data_policy", _c(level="L2"), CLOUD, None),
    ("data_policy", _c(level="L3"), CLOUD, None),
    # carried: what the session carries goes only where the turns it came from could (router/sessions/carried.py)
    ("carried", BASE, CLOUD, None),
    ("carried", _c(carried=PRIVATE), LOCAL, None),
    ("carried", _c(carried=Label(level="L2", residency=frozenset({"us-east"}))), CLOUD, None),
    (
        "carried",
        _c(carried=PRIVATE),
        CLOUD,
        "the context this session carries from turn 1 (request r1, scenario 'private') may not go here: "
        "residency local_only: the request may not leave the cluster",
    ),
    (
        "carried",
        _c(carried=Label(level="L1", origins=(("level", FIRST),))),
        CLOUD,
        "the context this session carries from turn 1 (request r1, scenario 'private') may not go here: "
        "data policy 'retention' not allowed at L1 (needs on_prem or no_retention)",
    ),
    (
        "carried",
        _c(carried=Label(targets=(("local:*",),), origins=(("targets", FIRST),))),
        CLOUD,
        "the context this session carries from turn 1 (request r1, scenario 'private') may not go here: "
        "not allowed by scenario 'private' (allowed_targets: local:*)",
    ),
    # context
    ("context", _c(est_prompt_tokens=3840, max_output_tokens=256), LOCAL, None),
    (
        "context",
        _c(est_prompt_tokens=5000, max_output_tokens=200),
        LOCAL,
        "context window 4096 < needed 5200 (prompt ~5000 + max_tokens 200)",
    ),
    (
        "context",
        _c(est_prompt_tokens=10),
        local_target("qwen", {}),
        "context window unknown (set max_model_len) < needed 266 (prompt ~10 + max_tokens 256)",
    ),
    # max_output
    ("max_output", _c(max_output_tokens=4096), CLOUD, None),
    ("max_output", _c(max_output_tokens=100_000), LOCAL, None),
    ("max_output", _c(max_output_tokens=5000), CLOUD, "max output tokens 4096 < max_tokens 5000"),
    # tools
    ("tools", _c(needs_tools=True), _t(CLOUD, tools=True), None),
    ("tools", _c(needs_tools=False), CLOUD, None),
    ("tools", _c(needs_tools=True), CLOUD, "tools (function calling) not supported"),
    # parallel_tools
    ("parallel_tools", _c(needs_parallel_tools=True), _t(CLOUD, tools=True, parallel_tool_calls=True), None),
    (
        "parallel_tools",
        _c(needs_parallel_tools=True, tool_schemas={"a": {}, "b": {}, "c": {}}),
        _t(CLOUD, tools=True),
        "parallel tool calls not supported (3 tools, parallel_tool_calls=true)",
    ),
    # structured_output
    ("structured_output", _c(needs_json_schema=True), LOCAL, None),
    ("structured_output", _c(needs_json_mode=True), LOCAL, None),
    ("structured_output", BASE, CLOUD, None),
    (
        "structured_output",
        _c(needs_json_schema=True),
        CLOUD,
        "response_format json_schema (structured outputs) not supported",
    ),
    ("structured_output", _c(needs_json_mode=True), CLOUD, "response_format json_object (JSON mode) not supported"),
    # streaming
    ("streaming", _c(needs_streaming=True), CLOUD, None),
    ("streaming", _c(needs_streaming=True), _t(CLOUD, streaming=False), "streaming not supported"),
    # modalities
    ("modalities", BASE, LOCAL, None),
    (
        "modalities",
        _c(modalities=frozenset({"text", "image"})),
        _t(CLOUD, modalities=frozenset({"text", "image"})),
        None,
    ),
    (
        "modalities",
        _c(modalities=frozenset({"text", "image", "audio"})),
        LOCAL,
        "input modality audio, image not supported (supports text)",
    ),
    # completions_api: a chat never asks; a completions request needs the API (local vLLM serves it), and
    # echo / logprobs when it asks for them
    ("completions_api", BASE, CLOUD, None),
    ("completions_api", _c(api="completions", needs_echo=True, needs_logprobs=True), LOCAL, None),
    ("completions_api", _c(api="completions"), _t(CLOUD, completions=True), None),
    ("completions_api", _c(api="completions"), CLOUD, "the completions API (/v1/completions) not supported"),
    (
        "completions_api",
        _c(api="completions", needs_echo=True),
        _t(CLOUD, completions=True),
        "completions echo not supported",
    ),
    (
        "completions_api",
        _c(api="completions", needs_logprobs=True),
        _t(CLOUD, completions=True, echo=True),
        "completions logprobs not supported",
    ),
    # cost: 1000 × $2.5/M + 256 × $10/M = $0.00506
    ("cost", _c(est_prompt_tokens=1000), CLOUD, None),
    ("cost", _c(est_prompt_tokens=1000, max_cost_usd=0.006), CLOUD, None),
    ("cost", _c(est_prompt_tokens=10**6, max_cost_usd=0.01), LOCAL, None),
    (
        "cost",
        _c(est_prompt_tokens=1000, max_cost_usd=0.005),
        CLOUD,
        "estimated cost $0.005060 > max $0.005000 (prompt ~1000 × $2.5/Mtok + max_tokens 256 × $10/Mtok)",
    ),
    (
        "cost",
        _c(max_cost_usd=0.02),
        _t(CLOUD, price_out_per_mtok=None),
        "prices unknown: cannot check max cost $0.0200 (configure price_in/out_per_mtok)",
    ),
    # quality_floor
    ("quality_floor", _c(quality_floor=0.6), CLOUD, None),
    ("quality_floor", _c(quality_floor=0.61), CLOUD, "quality 0.60 < floor 0.61 (scenario 's')"),
]


def _filter(name: str) -> filters.CheckFilter:
    return next(f for f in filters.DEFAULT_FILTERS if f.name == name)  # type: ignore[misc]


@pytest.mark.parametrize(("name", "contract", "target", "reason"), CASES)
def test_filter(name: str, contract: RequestContract, target: Target, reason: str | None) -> None:
    assert _filter(name).apply(contract, target, TargetState()) == reason


def test_every_filter_has_keep_and_remove_cases() -> None:
    names = {f.name for f in filters.DEFAULT_FILTERS}
    kept = {name for name, *_, reason in CASES if reason is None}
    removed = {name for name, *_, reason in CASES if reason is not None}
    assert names == kept == removed


def test_availability_is_not_a_filter() -> None:
    down = TargetState(available=False)
    assert all(f.apply(BASE, LOCAL, down) is None for f in filters.DEFAULT_FILTERS)


def test_reasons_never_carry_base_urls_or_keys() -> None:
    worst = _c(
        level="L1",
        residency=frozenset({"eu"}),
        needs_tools=True,
        needs_json_schema=True,
        max_cost_usd=0.0001,
        quality_floor=0.9,
    )
    for f in filters.DEFAULT_FILTERS:
        reason = f.apply(worst, CLOUD, TargetState()) or ""
        assert "http" not in reason and "key" not in reason.lower()
