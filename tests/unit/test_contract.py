"""Deriving the request contract: what the body needs, and headers that narrow but never widen."""

from __future__ import annotations

from typing import Any

import pytest

from router.errors import InvalidRequest
from router.request.contract import derive_contract
from router.routing.policy import Policy, Scenario

POLICY = Policy(
    version="7",
    scenarios={
        "default": Scenario(),
        "eu": Scenario(level="L1", residency=["eu-west", "eu-central"], max_cost_usd=0.05, deadline_ms=2000),
        "onprem": Scenario(level="L3", strategy="cost", residency="local_only", allowed_targets=["local:*"]),
    },
)
STRICT = Policy(require_scenario=True, scenarios={"tickets": Scenario()})
USER = {"role": "user", "content": "x" * 40}


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": "qwen", "messages": [USER], **extra}


def _tool(name: str, parameters: Any = None) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    if parameters is not None:
        fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def test_plain_request() -> None:
    c = derive_contract(_body(), {}, POLICY)
    assert (c.model, c.scenario, c.level, c.strategy) == ("qwen", "default", "L2", "quality")
    assert c.est_prompt_tokens == 10 + 4  # ceil(40 / 4) + 4 per message
    assert (c.max_output_tokens, c.min_context) == (256, 270)
    assert not (c.needs_tools or c.needs_parallel_tools or c.needs_json_schema or c.needs_json_mode)
    assert not c.needs_streaming
    assert c.modalities == frozenset({"text"})
    assert (c.residency, c.allowed_providers, c.allowed_target_patterns) == ("any", None, ("*",))
    assert (c.max_cost_usd, c.deadline_ms, c.quality_floor) == (None, None, 0)


def test_token_estimate_variants() -> None:
    assert derive_contract(_body(), {}, POLICY, count_tokens=lambda s: 3).est_prompt_tokens == 3 + 4
    body = _body(messages=[{"role": "system", "content": "abc"}, USER])
    assert derive_contract(body, {}, POLICY).est_prompt_tokens == 11 + 8  # ceil(43 / 4) + 2 × 4
    assert derive_contract(_body(max_tokens=10, max_completion_tokens=20), {}, POLICY).max_output_tokens == 20
    assert derive_contract(_body(), {}, POLICY, default_max_tokens=64).max_output_tokens == 64
    with_tools = derive_contract(_body(tools=[_tool("f", {"type": "object"})]), {}, POLICY)
    assert with_tools.est_prompt_tokens > 14  # tool definitions count
    completion = derive_contract({"model": "qwen", "prompt": "y" * 8}, {}, POLICY)
    assert completion.est_prompt_tokens == 2
    assert derive_contract({"model": "q", "prompt": [1, 2, 3]}, {}, POLICY).est_prompt_tokens == 3
    assert derive_contract({"model": "q", "prompt": [[1, 2], [3]]}, {}, POLICY).est_prompt_tokens == 3
    assert derive_contract({"model": "q", "prompt": ["abcd", "efgh"]}, {}, POLICY).est_prompt_tokens == 2


def test_content_parts_and_modalities() -> None:
    content = [
        {"type": "text", "text": "x" * 8},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ]
    c = derive_contract(_body(messages=[{"role": "user", "content": content}]), {}, POLICY)
    assert c.modalities == frozenset({"text", "image", "audio"})
    assert c.est_prompt_tokens == 2 + 4  # images and audio are not counted


@pytest.mark.parametrize(
    ("extra", "tools", "parallel"),
    [
        ({"tools": [_tool("a")]}, True, False),
        ({"tools": [_tool("a"), _tool("b")]}, True, False),
        ({"tools": [_tool("a"), _tool("b")], "parallel_tool_calls": True}, True, True),
        ({"tools": [_tool("a")], "parallel_tool_calls": True}, True, False),
        ({"tools": [_tool("a"), _tool("b")], "parallel_tool_calls": False}, True, False),
        ({"messages": [USER, {"role": "tool", "tool_call_id": "1", "content": "42"}]}, True, False),
        (
            {"messages": [USER, {"role": "assistant", "tool_calls": [{"function": {"name": "a", "arguments": "{}"}}]}]},
            True,
            False,
        ),
        ({}, False, False),
    ],
)
def test_tools(extra: dict[str, Any], tools: bool, parallel: bool) -> None:
    c = derive_contract(_body(**extra), {}, POLICY)
    assert (c.needs_tools, c.needs_parallel_tools) == (tools, parallel)


@pytest.mark.parametrize(
    ("choice", "must_call"),
    [
        (None, None),
        ("auto", None),
        ("none", None),
        ("required", "*"),
        ({"type": "function", "function": {"name": "b"}}, "b"),
    ],
)
def test_a_tool_choice_that_obliges_a_call(choice: Any, must_call: str | None) -> None:
    extra = {} if choice is None else {"tool_choice": choice}
    contract = derive_contract(_body(tools=[_tool("a"), _tool("b")], **extra), {}, POLICY)
    assert contract.must_call == must_call and contract.to_dict()["must_call"] == must_call


def test_tool_schemas_kept_for_the_output_check() -> None:
    c = derive_contract(_body(tools=[_tool("a", {"type": "object"}), _tool("b")]), {}, POLICY)
    assert c.tool_schemas == {"a": {"type": "object"}, "b": {}}


@pytest.mark.parametrize(
    ("fmt", "schema", "json_mode"),
    [
        ({"type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "object"}}}, True, False),
        ({"type": "json_object"}, False, True),
        ({"type": "text"}, False, False),
    ],
)
def test_response_format(fmt: dict[str, Any], schema: bool, json_mode: bool) -> None:
    c = derive_contract(_body(response_format=fmt, stream=True), {}, POLICY)
    assert (c.needs_json_schema, c.needs_json_mode, c.needs_streaming) == (schema, json_mode, True)
    assert c.json_schema == ({"type": "object"} if schema else None)


@pytest.mark.parametrize(
    ("extra", "param", "fragment"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "objekt"}}}},
            "response_format.json_schema.schema",
            "not a valid JSON Schema: 'objekt' is not valid under any of the given schemas",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"required": "a"}}}},
            "response_format.json_schema.schema",
            "'a' is not of type 'array' (at required)",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": []}}},
            "response_format.json_schema.schema",
            "must be a JSON Schema object",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "t"}}},
            "response_format.json_schema.schema",
            "is required",
        ),
        (
            {"tools": [_tool("ok"), _tool("bad", {"type": "object", "properties": {"n": {"minimum": "0"}}})]},
            "tools[1].function.parameters",
            "'0' is not of type 'number'",
        ),
    ],
)
def test_invalid_json_schema(extra: dict[str, Any], param: str, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        derive_contract(_body(**extra), {}, POLICY)
    err = caught.value
    assert (err.status_code, err.code, err.param) == (400, "invalid_json_schema", param)
    assert fragment in err.message


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"tool_choice": "required"}, "tool_choice"),  # a call asked for, no tool to call
        ({"tools": [_tool("a")], "tool_choice": {"type": "function", "function": {"name": "b"}}}, "tool_choice"),
        ({"tools": [_tool("a")], "tool_choice": {"type": "function", "function": "a"}}, "tool_choice"),
    ],
)
def test_invalid_body_fields(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        derive_contract(_body(**extra), {}, POLICY)
    assert (caught.value.status_code, caught.value.param) == (400, param)


EU = frozenset({"eu-west", "eu-central"})


@pytest.mark.parametrize(
    ("scenario", "headers", "field", "expected"),
    [
        # level: the stricter wins
        ("default", {}, "level", "L2"),
        ("default", {"x-spillover-level": "L1"}, "level", "L1"),
        ("default", {"x-spillover-level": "L3"}, "level", "L2"),
        ("eu", {"x-spillover-level": "L3"}, "level", "L1"),
        ("onprem", {"x-spillover-level": "l2"}, "level", "L2"),
        # residency: intersection, local_only wins
        ("default", {"x-spillover-residency": "local_only"}, "residency", "local_only"),
        ("default", {"x-spillover-residency": "eu-west, us-east"}, "residency", frozenset({"eu-west", "us-east"})),
        ("onprem", {"x-spillover-residency": "any"}, "residency", "local_only"),
        ("onprem", {"x-spillover-residency": "eu-west"}, "residency", "local_only"),
        ("eu", {}, "residency", EU),
        ("eu", {"x-spillover-residency": "any"}, "residency", EU),
        ("eu", {"x-spillover-residency": "eu-west,us-east"}, "residency", frozenset({"eu-west"})),
        ("eu", {"x-spillover-residency": "us-east"}, "residency", frozenset()),
        ("eu", {"x-spillover-residency": "LOCAL_ONLY"}, "residency", "local_only"),
        # providers: the header (the scenario has no provider list)
        ("default", {}, "allowed_providers", None),
        ("default", {"x-spillover-providers": "openai, azure"}, "allowed_providers", frozenset({"openai", "azure"})),
        # cost and deadline: the minimum
        ("default", {"x-spillover-max-cost-usd": "0.5"}, "max_cost_usd", 0.5),
        ("eu", {"x-spillover-max-cost-usd": "0.01"}, "max_cost_usd", 0.01),
        ("eu", {"x-spillover-max-cost-usd": "1"}, "max_cost_usd", 0.05),
        ("eu", {}, "deadline_ms", 2000),
        ("eu", {"x-spillover-deadline-ms": "500"}, "deadline_ms", 500),
        ("eu", {"x-spillover-deadline-ms": "9000"}, "deadline_ms", 2000),
        ("default", {"x-spillover-deadline-ms": "9000"}, "deadline_ms", 9000),
        # from the scenario only
        ("onprem", {}, "strategy", "cost"),
        ("onprem", {}, "allowed_target_patterns", ("local:*",)),
    ],
)
def test_headers_narrow_never_widen(scenario: str, headers: dict[str, str], field: str, expected: Any) -> None:
    c = derive_contract(_body(), {"x-business-scenario": scenario, **headers}, POLICY)
    assert c.scenario == scenario
    assert getattr(c, field) == expected


def test_header_names_are_case_insensitive() -> None:
    c = derive_contract(_body(), {"X-Business-Scenario": "eu", "X-Spillover-Deadline-Ms": "100"}, POLICY)
    assert (c.scenario, c.deadline_ms) == ("eu", 100)


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("x-spillover-level", "L4"),
        ("x-spillover-level", ""),
        ("x-spillover-residency", "local_only,eu-west"),
        ("x-spillover-residency", "eu-west,,us-east"),
        ("x-spillover-providers", ""),
        ("x-spillover-providers", "openai,"),
        ("x-spillover-max-cost-usd", "abc"),
        ("x-spillover-max-cost-usd", "0"),
        ("x-spillover-max-cost-usd", "-1"),
        ("x-spillover-max-cost-usd", "nan"),
        ("x-spillover-max-cost-usd", "inf"),
        ("x-spillover-deadline-ms", "1.5"),
        ("x-spillover-deadline-ms", "0"),
        ("x-spillover-deadline-ms", "soon"),
    ],
)
def test_bad_headers(header: str, value: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        derive_contract(_body(), {header: value}, POLICY)
    assert (caught.value.status_code, caught.value.param) == (400, header)
    assert header in caught.value.message


def test_unknown_scenario_names_the_known_ones() -> None:
    with pytest.raises(InvalidRequest) as caught:
        derive_contract(_body(), {"x-business-scenario": "homework"}, POLICY)
    err = caught.value
    assert (err.status_code, err.code, err.param) == (400, "unknown_scenario", "x-business-scenario")
    assert "'homework'" in err.message and "default, eu, onprem" in err.message


@pytest.mark.parametrize("headers", [{}, {"x-business-scenario": " "}])
def test_scenario_required(headers: dict[str, str]) -> None:
    with pytest.raises(InvalidRequest) as caught:
        derive_contract(_body(), headers, STRICT)
    assert (caught.value.code, caught.value.param) == ("scenario_required", "x-business-scenario")
    assert "tickets" in caught.value.message
    assert derive_contract(_body(), {"x-business-scenario": "tickets"}, STRICT).scenario == "tickets"


def test_default_scenario_when_no_header() -> None:
    policy = Policy(default_scenario="b", scenarios={"a": Scenario(), "b": Scenario(level="L3")})
    assert derive_contract(_body(), {}, policy).scenario == "b"


def test_to_dict_is_json_safe() -> None:
    import json

    headers = {"x-business-scenario": "eu", "x-spillover-providers": "b,a"}
    c = derive_contract(_body(tools=[_tool("f")]), headers, POLICY)
    data = json.loads(json.dumps(c.to_dict()))
    assert data["residency"] == ["eu-central", "eu-west"]
    assert data["allowed_providers"] == ["a", "b"]
    assert (data["tools"], data["min_context"], data["level"]) == (["f"], c.min_context, "L1")
