"""Output contracts: does a chat completion message deliver what the request's contract asked for?

    check_output(contract, message) -> OutputVerdict   ok | repaired | violated
    enforce(level, verdict)         -> Action          what the caller does with it

Checks:

- `needs_json_schema`: the content must parse as JSON and validate against the request's schema.
  Content that is not JSON is repaired by taking the first balanced JSON object/array out of the
  surrounding text ("Sure! {"a": 1} hope it helps", a ```json fence) and validating that; the
  verdict then carries the repaired content for the caller to send instead.
- `needs_json_mode`: the content must be (or contain, repaired) a JSON value.
- tool calls: each `function.arguments` must be JSON valid against the declared tool's
  `parameters`; a tool name the request did not declare is a violation.
- `must_call` (`tool_choice: "required"` or a named function): the answer must call a tool (that one), and say
  nothing else — text instead of the call, however much it looks like one, is a violation.

A message that answers with tool calls and no content skips the content checks. Errors are
bounded (`MAX_ERRORS`, each cut to `MAX_ERROR_CHARS`).

Hostile schemas and answers are bounded: validators come from router/request/json_schema.py (nothing
outside the schema is resolved; patterns run on the `regex` engine under a time limit), one
check of one message stops after `timeout_s` (default `VALIDATION_TIMEOUT_S`) with a
"validation took longer than ..." error, an answer nested too deeply to parse or validate is a
violation (never a crash), and `extract_json` tries at most `MAX_JSON_CANDIDATES` openings, so
its work is linear in the answer's size. The caller runs `check_output` off its event loop.

Levels (router/routing/policy.py): L1 violated → `retry_next_or_fail` (try the next capable candidate if
the retry budget allows, else raise `contract_violation(...)`, 502); L2 violated → pass with a
warning header ("schema: 2 errors"); L3 → pass.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from jsonschema.exceptions import SchemaError
from referencing.exceptions import Unresolvable

from router import headers as hdr
from router.errors import ContractViolation
from router.request.contract import RequestContract
from router.request.json_schema import ValidationTimeout, schema_validator
from router.routing.policy import Level

MAX_ERRORS = 10
MAX_ERROR_CHARS = 200
VALIDATION_TIMEOUT_S = 2.0  # one message's whole check (JSON parse, schema, tool arguments)
MAX_JSON_CANDIDATES = 16  # openings extract_json tries: each costs one linear scan
_SPECIAL = re.compile(r'[\\"{}\[\]]')
CONTRACT_HEADER = hdr.CONTRACT
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


class _Budget:
    """The time left for one `check_output` call (monotonic clock)."""

    def __init__(self, timeout_s: float, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.end = clock() + timeout_s

    def left(self) -> float:
        return self.end - self.clock()


def schema_errors(
    instance: Any,
    schema: Mapping[str, Any],
    prefix: str = "",
    *,
    timeout_s: float = VALIDATION_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """Validation errors as "<json path>: <message>", in path order. Raises `ValidationTimeout`
    past `timeout_s`."""
    try:
        validator = schema_validator(schema, timeout_s, clock)
        found = sorted(validator.iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])
    except SchemaError as exc:
        return [f"{prefix}schema invalid: {exc.message}"]
    except Unresolvable as exc:  # refused when the request arrived; kept as a safety net
        return [f"{prefix}schema refers outside itself: {exc}"]
    except RecursionError:
        return [f"{prefix}nested too deeply to validate"]
    return [f"{prefix}{e.json_path}: {e.message}" for e in found]


def _loads(text: str) -> Any:
    """json.loads; a document nested too deeply to parse is a JSONDecodeError like any other."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text[:20], 0) from None


def extract_json(text: str) -> tuple[Any, str] | None:
    """The first balanced JSON object or array in `text` that parses: (value, its text). At
    most `MAX_JSON_CANDIDATES` openings are tried, each with one scan and one parse."""
    start = _next_opening(text, 0)
    tries = 0
    while start != -1 and tries < MAX_JSON_CANDIDATES:
        tries += 1
        end = _balanced_end(text, start)
        if end != -1:
            snippet = text[start : end + 1]
            try:
                return _loads(snippet), snippet
            except json.JSONDecodeError:
                pass
        start = _next_opening(text, start + 1)
    return None


def _next_opening(text: str, start: int) -> int:
    found = [i for i in (text.find("{", start), text.find("[", start)) if i != -1]
    return min(found) if found else -1


def _balanced_end(text: str, start: int) -> int:
    """Index of the bracket closing the one at `start` (strings and escapes respected), or -1.
    Only the characters that matter are visited (`_SPECIAL` skips the rest in C)."""
    depth, in_string, escaped_at = 0, False, -2
    for match in _SPECIAL.finditer(text, start):
        i, ch = match.start(), match.group()
        if in_string:
            if escaped_at == i - 1:
                continue  # this character is escaped
            if ch == "\\":
                escaped_at = i
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


def _check_content(contract: RequestContract, content: Any, budget: _Budget) -> tuple[list[str], str | None]:
    """(errors, repaired content or None)."""
    if not isinstance(content, str):
        return ["content: expected a JSON text, got none"], None
    repaired = None
    try:
        value = _loads(content)
    except json.JSONDecodeError as exc:
        found = extract_json(content)
        if found is None:
            return [f"content is not JSON and holds no JSON object or array: {exc.msg}"], None
        value, repaired = found
    if contract.needs_json_schema and contract.json_schema is not None:
        errors = schema_errors(value, contract.json_schema, "content ", timeout_s=budget.left(), clock=budget.clock)
        if errors:
            return errors, None
    return [], repaired


def _function(call: Any) -> tuple[Any, Any]:
    """A tool call's `function` object (None unless an object) and its `name` (as given, or None)."""
    fn = call.get("function") if isinstance(call, dict) else None
    return (fn, fn.get("name")) if isinstance(fn, dict) else (None, None)


def _check_tool_calls(contract: RequestContract, calls: list[Any], budget: _Budget) -> list[str]:
    errors: list[str] = []
    for i, call in enumerate(calls):
        fn, name = _function(call)
        where = f"tool_calls[{i}]"
        if not isinstance(name, str) or name not in contract.tool_schemas:
            declared = ", ".join(sorted(contract.tool_schemas)) or "none"
            errors.append(f"{where}: unknown tool {str(name)[:80]!r} (declared: {declared})")
            continue
        raw = fn.get("arguments") if isinstance(fn, dict) else None
        try:
            args = _loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError as exc:
            errors.append(f"{where} {name}: arguments are not JSON: {exc.msg}")
            continue
        prefix = f"{where} {name} arguments "
        errors += schema_errors(args, contract.tool_schemas[name], prefix, timeout_s=budget.left(), clock=budget.clock)
    return errors


def _called_as_asked(must_call: str, calls: list[Any], content: Any) -> list[str]:
    asked = "a tool call" if must_call == "*" else f"a call of {must_call!r}"
    if not calls:
        return [f"tool_choice asked for {asked}; the answer has none"]
    errors = []
    if must_call != "*":
        names = [_function(c)[1] for c in calls]
        if any(name != must_call for name in names):
            errors.append(f"tool_choice asked for {asked}; the answer calls {', '.join(map(str, names))[:120]}")
    if isinstance(content, str) and content.strip():
        errors.append(f"tool_choice asked for {asked}; the answer also holds text")
    return errors


def check_output(
    contract: RequestContract,
    message: Mapping[str, Any],
    *,
    timeout_s: float = VALIDATION_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
) -> OutputVerdict:
    """The verdict on one chat completion message (`choices[i].message`); a check that takes
    longer than `timeout_s` is a violation saying so."""
    errors: list[str] = []
    repaired = None
    budget = _Budget(timeout_s, clock)
    calls = message.get("tool_calls") or []
    content = message.get("content")
    wants_json = contract.needs_json_schema or contract.needs_json_mode
    try:
        if wants_json and not (calls and not content):
            content_errors, repaired = _check_content(contract, content, budget)
            errors += content_errors
        listed = calls if isinstance(calls, list) else [calls]
        if calls:
            errors += _check_tool_calls(contract, listed, budget)
        if contract.must_call is not None:
            errors += _called_as_asked(contract.must_call, listed, content)
    except ValidationTimeout as exc:
        errors.append(f"the answer could not be checked: {exc}")
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
