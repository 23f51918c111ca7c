"""Output contracts: does a chat completion message deliver what the request's contract asked for?

    check_output(contract, message) -> OutputVerdict   ok | repaired | violated
    enforce(level, verdict)         -> Action          what the caller does with it

Checks (seed 000 §2.4, §3.2):

- `needs_json_schema`: the content must parse as JSON and validate against the request's schema.
  Content that is not JSON is repaired by taking the first balanced JSON object/array out of the
  surrounding text ("Sure! {"a": 1} hope it helps", a ```json fence) and validating that; the
  verdict then carries the repaired content for the caller to send instead.
- `needs_json_mode`: the content must be (or contain, repaired) a JSON value.
- tool calls: each `function.arguments` must be JSON valid against the declared tool's
  `parameters`; a tool name the request did not declare is a violation.

A message that answers with tool calls and no content skips the content checks. Errors are
bounded (`MAX_ERRORS`, each cut to `MAX_ERROR_CHARS`).

Levels (router/policy.py): L1 violated → `retry_next_or_fail` (try the next capable candidate if
the retry budget allows, else raise `contract_violation(...)`, 502); L2 violated → pass with a
warning header ("schema: 2 errors"); L3 → pass.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from router.contract import RequestContract
from router.errors import ContractViolation
from router.policy import Level

MAX_ERRORS = 10
MAX_ERROR_CHARS = 200
CONTRACT_HEADER = "x-spillover-contract"
Status = Literal["ok", "repaired", "violated"]
ActionKind = Literal["pass", "pass_with_warning", "retry_next_or_fail"]


@dataclass(frozen=True)
class OutputVerdict:
    status: Status
    errors: tuple[str, ...] = ()  # the first MAX_ERRORS, each cut to MAX_ERROR_CHARS
    content: str | None = None  # the repaired content when status == "repaired"
    error_count: int = 0  # all errors found


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    header: str | None = None  # value for CONTRACT_HEADER, e.g. "schema: 2 errors" or "repaired"
    content: str | None = None  # send this content instead of the model's (repaired JSON)
    errors: tuple[str, ...] = ()


def _bounded(errors: list[str]) -> list[str]:
    return [e[:MAX_ERROR_CHARS] for e in errors[:MAX_ERRORS]]


def schema_errors(instance: Any, schema: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Validation errors as "<json path>: <message>", in path order."""
    try:
        validator = validator_for(schema)(schema)
        found = sorted(validator.iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])
    except SchemaError as exc:
        return [f"{prefix}schema invalid: {exc.message}"]
    return [f"{prefix}{e.json_path}: {e.message}" for e in found]


def extract_json(text: str) -> tuple[Any, str] | None:
    """The first balanced JSON object or array in `text` that parses: (value, its text)."""
    start = _next_opening(text, 0)
    while start != -1:
        end = _balanced_end(text, start)
        if end != -1:
            snippet = text[start : end + 1]
            try:
                return json.loads(snippet), snippet
            except json.JSONDecodeError:
                pass
        start = _next_opening(text, start + 1)
    return None


def _next_opening(text: str, start: int) -> int:
    found = [i for i in (text.find("{", start), text.find("[", start)) if i != -1]
    return min(found) if found else -1


def _balanced_end(text: str, start: int) -> int:
    """Index of the bracket closing the one at `start` (strings and escapes respected), or -1."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _check_content(contract: RequestContract, content: Any) -> tuple[list[str], str | None]:
    """(errors, repaired content or None)."""
    if not isinstance(content, str):
        return ["content: expected a JSON text, got none"], None
    repaired = None
    try:
        value = json.loads(content)
    except json.JSONDecodeError as exc:
        found = extract_json(content)
        if found is None:
            return [f"content is not JSON and holds no JSON object or array: {exc.msg}"], None
        value, repaired = found
    if contract.needs_json_schema and contract.json_schema is not None:
        errors = schema_errors(value, contract.json_schema, "content ")
        if errors:
            return errors, None
    return [], repaired


def _check_tool_calls(contract: RequestContract, calls: list[Any]) -> list[str]:
    errors: list[str] = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        where = f"tool_calls[{i}]"
        if not isinstance(name, str) or name not in contract.tool_schemas:
            declared = ", ".join(sorted(contract.tool_schemas)) or "none"
            errors.append(f"{where}: unknown tool {name!r} (declared: {declared})")
            continue
        raw = fn.get("arguments") if isinstance(fn, dict) else None
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError as exc:
            errors.append(f"{where} {name}: arguments are not JSON: {exc.msg}")
            continue
        errors += schema_errors(args, contract.tool_schemas[name], f"{where} {name} arguments ")
    return errors


def check_output(contract: RequestContract, message: Mapping[str, Any]) -> OutputVerdict:
    """The verdict on one chat completion message (`choices[i].message`)."""
    errors: list[str] = []
    repaired = None
    calls = message.get("tool_calls") or []
    content = message.get("content")
    wants_json = contract.needs_json_schema or contract.needs_json_mode
    if wants_json and not (calls and not content):
        content_errors, repaired = _check_content(contract, content)
        errors += content_errors
    if calls:
        errors += _check_tool_calls(contract, calls if isinstance(calls, list) else [calls])
    if errors:
        return OutputVerdict("violated", tuple(_bounded(errors)), error_count=len(errors))
    if repaired is not None:
        return OutputVerdict("repaired", content=repaired)
    return OutputVerdict("ok")


def _summary(verdict: OutputVerdict) -> str:
    n = verdict.error_count
    return f"schema: {n} error{'s' if n != 1 else ''}"


def enforce(level: Level, verdict: OutputVerdict) -> Action:
    """L1: a violation means try the next capable candidate or fail; L2: pass, warn; L3: pass
    untouched. A repaired answer (L1, L2) passes with the repaired content."""
    if verdict.status == "ok" or level == "L3":
        return Action("pass")
    if verdict.status == "repaired":
        return Action("pass", header="repaired", content=verdict.content)
    if level == "L1":
        return Action("retry_next_or_fail", header=_summary(verdict), errors=verdict.errors)
    if level == "L2":
        return Action("pass_with_warning", header=_summary(verdict), errors=verdict.errors)
    return Action("pass")


def contract_violation(verdict: OutputVerdict, target: str) -> ContractViolation:
    """The 502 to raise when an L1 violation cannot be retried on another candidate."""
    return ContractViolation(
        f"the answer of {target} broke the request's output contract ({_summary(verdict)})",
        errors=list(verdict.errors),
    )
