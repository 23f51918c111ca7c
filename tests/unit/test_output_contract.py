"""Output contracts: JSON Schema and tool-argument checks, repair from text, and level semantics."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from router.errors import ContractViolation, UpstreamError
from router.output.output_contract import (
    MAX_ERROR_CHARS,
    MAX_ERRORS,
    Action,
    OutputVerdict,
    check_output,
    contract_violation,
    enforce,
    extract_json,
)
from router.request.contract import RequestContract

TICKET = {
    "type": "object",
    "required": ["category", "urgency"],
    "properties": {
        "category": {"type": "string"},
        "urgency": {"enum": ["high", "medium", "low"]},
    },
    "additionalProperties": False,
}
BASE = RequestContract(model="m", scenario="s", level="L1", strategy="quality")
SCHEMA = replace(BASE, needs_json_schema=True, json_schema=TICKET)
JSON_MODE = replace(BASE, needs_json_mode=True)
TOOLS = replace(
    BASE,
    needs_tools=True,
    tool_schemas={
        "assign": {"type": "object", "required": ["team"], "properties": {"team": {"type": "string"}}},
        "noop": {},
    },
)
GOOD = '{"category": "network", "urgency": "high"}'


def _msg(content: Any = None, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls is not None:
        message["tool_calls"] = calls
    return message


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    ("contract", "message", "status", "content", "errors"),
    [
        (BASE, _msg("free text"), "ok", None, ()),
        (SCHEMA, _msg(GOOD), "ok", None, ()),
        (SCHEMA, _msg(f"Sure! {GOOD} hope it helps"), "repaired", GOOD, ()),
        (SCHEMA, _msg(f"```json\n{GOOD}\n```"), "repaired", GOOD, ()),
        (SCHEMA, _msg('Note {not json} then {"category": "x", "urgency": "low"}.'), "repaired", None, ()),
        (
            SCHEMA,
            _msg('{"category": 7, "urgency": "now", "extra": 1}'),
            "violated",
            None,
            (
                "content $: Additional properties are not allowed ('extra' was unexpected)",
                "content $.category: 7 is not of type 'string'",
                "content $.urgency: 'now' is not one of ['high', 'medium', 'low']",
            ),
        ),
        (
            SCHEMA,
            _msg('Here: {"category": "x"}'),
            "violated",
            None,
            ("content $: 'urgency' is a required property",),
        ),
        (
            SCHEMA,
            _msg("no json at all"),
            "violated",
            None,
            ("content is not JSON and holds no JSON object or array: Expecting value",),
        ),
        (SCHEMA, _msg(None), "violated", None, ("content: expected a JSON text, got none",)),
        (JSON_MODE, _msg("[1, 2]"), "ok", None, ()),
        (JSON_MODE, _msg("result: [1, 2]!"), "repaired", "[1, 2]", ()),
        (TOOLS, _msg(None, [_call("assign", '{"team": "net"}')]), "ok", None, ()),
        (TOOLS, _msg(None, [_call("noop", "{}"), _call("assign", {"team": "dict args"})]), "ok", None, ()),
        (
            TOOLS,
            _msg(None, [_call("assign", '{"team": 3}')]),
            "violated",
            None,
            ("tool_calls[0] assign arguments $.team: 3 is not of type 'string'",),
        ),
        (
            TOOLS,
            _msg(None, [_call("noop", "{}"), _call("assign", "{team: 'x'")]),
            "violated",
            None,
            ("tool_calls[1] assign: arguments are not JSON: Expecting property name enclosed in double quotes",),
        ),
        (
            TOOLS,
            _msg(None, [_call("delete_all", "{}")]),
            "violated",
            None,
            ("tool_calls[0]: unknown tool 'delete_all' (declared: assign, noop)",),
        ),
        (
            BASE,
            _msg(None, [_call("anything", "{}")]),
            "violated",
            None,
            ("tool_calls[0]: unknown tool 'anything' (declared: none)",),
        ),
        # a tool-call turn with a schema contract: the content check waits for the final answer
        (replace(SCHEMA, tool_schemas=TOOLS.tool_schemas), _msg(None, [_call("noop", "{}")]), "ok", None, ()),
    ],
)
def test_check_output(
    contract: RequestContract, message: dict[str, Any], status: str, content: str | None, errors: tuple[str, ...]
) -> None:
    verdict = check_output(contract, message)
    assert verdict.status == status
    assert verdict.errors == errors
    assert verdict.error_count == len(errors)
    if content is not None:
        assert verdict.content == content
    if status == "repaired":
        assert json.loads(verdict.content or "") is not None


def test_errors_are_bounded() -> None:
    schema = {"type": "object", "properties": {f"f{i}": {"type": "string"} for i in range(30)}}
    contract = replace(BASE, needs_json_schema=True, json_schema=schema)
    content = json.dumps({f"f{i}": i * 10**300 for i in range(30)})
    verdict = check_output(contract, _msg(content))
    assert verdict.status == "violated"
    assert (len(verdict.errors), verdict.error_count) == (MAX_ERRORS, 30)
    assert all(len(e) <= MAX_ERROR_CHARS for e in verdict.errors)


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ('x {"a": "}"} y', {"a": "}"}),
        ('x {"a": "\\"}"} y', {"a": '"}'}),
        ("[[1], {]", [1]),  # the outer array never closes; the first balanced one is [1]
        ('{ {"a": [1, 2]} }', {"a": [1, 2]}),
        ("nothing", None),
    ],
)
def test_extract_json(text: str, found: Any) -> None:
    result = extract_json(text)
    assert (result[0] if result else None) == found


VIOLATED = OutputVerdict("violated", ("content $: 'urgency' is a required property", "x"), error_count=2)


@pytest.mark.parametrize(
    ("level", "verdict", "action"),
    [
        ("L1", OutputVerdict("ok"), Action("pass")),
        ("L1", OutputVerdict("repaired", content="{}"), Action("pass", header="repaired", content="{}")),
        ("L1", VIOLATED, Action("retry_next_or_fail", header="schema: 2 errors", errors=VIOLATED.errors)),
        ("L2", VIOLATED, Action("pass_with_warning", header="schema: 2 errors", errors=VIOLATED.errors)),
        (
            "L2",
            OutputVerdict("violated", ("e",), error_count=1),
            Action("pass_with_warning", "schema: 1 error", None, ("e",)),
        ),
        ("L3", VIOLATED, Action("pass")),
        ("L3", OutputVerdict("ok"), Action("pass")),
        ("L3", OutputVerdict("repaired", content="{}"), Action("pass")),
        ("L2", OutputVerdict("repaired", content="{}"), Action("pass", header="repaired", content="{}")),
    ],
)
def test_enforce(level: str, verdict: OutputVerdict, action: Action) -> None:
    assert enforce(level, verdict) == action  # type: ignore[arg-type]


def test_contract_violation_error() -> None:
    err = contract_violation(VIOLATED, "cloud:openai/qwen")
    assert isinstance(err, ContractViolation) and isinstance(err, UpstreamError)
    assert (err.status_code, err.code) == (502, "contract_violation")
    body = err.to_openai()["error"]
    assert body["errors"] == list(VIOLATED.errors)
    assert body["code"] == "contract_violation"
    assert "cloud:openai/qwen" in body["message"] and "schema: 2 errors" in body["message"]


@pytest.mark.parametrize(
    ("must_call", "message", "errors"),
    [
        ("*", _msg(None, [_call("assign", '{"team": "net"}')]), []),
        ("assign", _msg(None, [_call("assign", '{"team": "net"}')]), []),
        # what SmolLM2 and qwen2-tiny-random emit through vLLM's hermes parser when the answer runs out of
        # tokens before the call closes: the call as text, no tool_calls
        ("*", _msg('<tool_call>\n{"name": "assign", "arguments": {"team"'), ["the answer has none"]),
        ("assign", _msg("Sure, I can help."), ["the answer has none"]),
        ("assign", _msg(None, [_call("noop", "{}")]), ["the answer calls noop"]),
        ("*", _msg("Calling it now.", [_call("noop", "{}")]), ["the answer also holds text"]),
    ],
)
def test_a_tool_choice_that_obliges_a_call(must_call: str, message: dict[str, Any], errors: list[str]) -> None:
    verdict = check_output(replace(TOOLS, must_call=must_call), message)
    assert len(verdict.errors) == len(errors) and all(f in e for f, e in zip(errors, verdict.errors, strict=True))
    assert verdict.status == ("violated" if errors else "ok")
    assert check_output(TOOLS, message).status == "ok"  # "auto" (no obligation): each of these is an answer


def test_a_malformed_call_under_an_obligation_is_a_violation_not_a_crash() -> None:
    """A provider's call whose `function` is not an object, where tool_choice named the function."""
    message = _msg(None, [{"id": "c1", "type": "function", "function": "assign"}])
    verdict = check_output(replace(TOOLS, must_call="assign"), message)
    assert verdict.status == "violated" and any("the answer calls None" in e for e in verdict.errors)
