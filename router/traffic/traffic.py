"""The operator's traffic controls, as one versioned document shared by every gateway replica.

    drain     {"action": "drain", "target": T}        T takes no new requests (unavailable, with the reason)
    undrain   {"action": "undrain", "target": T}
    pin       {"action": "pin", "model": M, "scenario"?: S, "target": T}
                                                      every other target of M (for S) is unavailable
    unpin     {"action": "unpin", "model": M, "scenario"?: S}
    switch    {"action": "switch", "model": M, "scenario"?: S, "primary": P, "standby": T,
               "step_s"?: s, "min_requests"?: n, "dry_run"?: {...}}
                                                      move M's (S's) traffic from P to T by graded steps
                                                      (router/traffic/migration.py) after T passed its dry-run
    rollback  {"action": "rollback", "model": M, "scenario"?: S}   the switch's new target back to 0%
    clear     {"action": "clear", "model": M, "scenario"?: S}      forget the switch (normal routing)

T and P are health keys: `local:<alias>` or `cloud:<provider>`. A scope is a model, or a model and a
scenario (`M/S`), which wins over the model's. Pure: `parse_command` checks a body as hostile input
(InvalidRequest naming the field), `apply` returns the next document, `unavailable` says which
targets a request may not use. The document is plain JSON (it travels to the shared actor).
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from router.error_codes import ErrorCode
from router.errors import InvalidRequest
from router.request.contract import RequestContract
from router.routing.capabilities import Target

ACTIONS = ("drain", "undrain", "pin", "unpin", "switch", "rollback", "clear")
_FIELDS = {
    "drain": {"target", "reason"},
    "undrain": {"target"},
    "pin": {"model", "scenario", "target"},
    "unpin": {"model", "scenario"},
    "switch": {"model", "scenario", "primary", "standby", "step_s", "min_requests", "dry_run"},
    "rollback": {"model", "scenario", "reason"},
    "clear": {"model", "scenario"},
}
MAX_HISTORY = 50
Doc = dict[str, Any]


def empty_doc() -> Doc:
    return {"version": 0, "drains": {}, "pins": {}, "switches": {}, "history": []}


@dataclass(frozen=True)
class Command:
    action: str
    model: str | None = None
    scenario: str | None = None
    target: str | None = None  # drain / pin target, switch standby
    primary: str | None = None
    reason: str = ""
    step_s: float | None = None
    min_requests: int | None = None
    dry_run: Mapping[str, Any] = field(default_factory=dict)

    @property
    def scope(self) -> str:
        return scope_of(self.model or "", self.scenario)


def scope_of(model: str, scenario: str | None) -> str:
    return f"{model}/{scenario}" if scenario else model


def endpoint_of(target_id: str) -> str:
    """`cloud:<provider>/<alias>` → `cloud:<provider>`; a local id is its own endpoint."""
    return target_id.split("/", 1)[0] if target_id.startswith("cloud:") else target_id


def parse_command(
    raw: bytes, *, models: Collection[str], targets: Collection[str], scenarios: Collection[str]
) -> Command:
    """A POST body as a Command; InvalidRequest (400) naming the field for anything else."""
    try:
        body: Any = json.loads(raw or b"null")
    except (ValueError, RecursionError):
        raise InvalidRequest("the body must be a JSON object", code=ErrorCode.INVALID_TRAFFIC_COMMAND) from None
    if not isinstance(body, dict):
        raise InvalidRequest('the body must be a JSON object with an "action"', code=ErrorCode.INVALID_TRAFFIC_COMMAND)
    action = body.get("action")
    if action not in ACTIONS:
        raise _bad("action", f'"action" must be one of {", ".join(ACTIONS)}')
    unknown = sorted(set(body) - _FIELDS[action] - {"action"})
    if unknown:
        raise _bad(unknown[0], f"{action} takes only {sorted(_FIELDS[action])}; unknown: {unknown[:5]}")
    model = _choice(body, "model", models, required="model" in _FIELDS[action])
    scenario = _choice(body, "scenario", scenarios, required=False)
    target_key = "standby" if action == "switch" else "target"
    target = _choice(body, target_key, targets, required=target_key in _FIELDS[action])
    primary = _choice(body, "primary", targets, required=action == "switch")
    if action == "switch" and primary == target:
        raise _bad("standby", "primary and standby must differ")
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > 200:
        raise _bad("reason", '"reason" must be a string of at most 200 characters')
    step_s = body.get("step_s")
    if step_s is not None and (
        isinstance(step_s, bool) or not isinstance(step_s, int | float) or not math.isfinite(step_s)
    ):
        raise _bad("step_s", '"step_s" must be a number of seconds')
    if step_s is not None and not 0 <= step_s <= 3600:
        raise _bad("step_s", '"step_s" must be between 0 and 3600')
    min_requests = body.get("min_requests")
    if min_requests is not None and (
        isinstance(min_requests, bool) or not isinstance(min_requests, int) or not 1 <= min_requests <= 10_000
    ):
        raise _bad("min_requests", '"min_requests" must be an integer between 1 and 10000')
    dry_run = body.get("dry_run", {})
    if not isinstance(dry_run, dict):
        raise _bad("dry_run", '"dry_run" must be an object (messages, tools, response_format)')
    return Command(
        action,
        model,
        scenario,
        target,
        primary,
        reason,
        None if step_s is None else float(step_s),
        min_requests,
        dry_run,
    )


def _bad(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code=ErrorCode.INVALID_TRAFFIC_COMMAND)


def _choice(body: Mapping[str, Any], key: str, known: Collection[str], *, required: bool) -> str | None:
    value = body.get(key)
    if value is None:
        if required:
            raise _bad(key, f'"{key}" is required')
        return None
    if not isinstance(value, str) or value not in known:
        shown = sorted(known)[:20]
        raise _bad(key, f'"{key}" must be one of {shown}')
    return value


def apply(doc: Doc, command: Command, *, at: float, switch_id: str = "") -> tuple[Doc, str]:
    """The next document and what changed, in words (for the history and the answer)."""
    out: Doc = json.loads(json.dumps(doc))  # a deep copy, JSON-safe by construction
    scope, action = command.scope, command.action
    if action == "drain":
        out["drains"][command.target] = {"at": at, "reason": command.reason or "operator drain"}
        said = f"{command.target} drained"
    elif action == "undrain":
        said = f"{command.target} undrained" if out["drains"].pop(command.target, None) else "nothing to undrain"
    elif action == "pin":
        out["pins"][scope] = {"target": command.target, "at": at}
        said = f"{scope} pinned to {command.target}"
    elif action == "unpin":
        said = f"{scope} unpinned" if out["pins"].pop(scope, None) else "nothing to unpin"
    elif action == "switch":
        out["switches"][scope] = {
            "id": switch_id,
            "primary": command.primary,
            "standby": command.target,
            "at": at,
            "phase": "running",
            "reason": "dry-run passed: graded switch started",
            "step_s": command.step_s,
            "min_requests": command.min_requests,
        }
        said = f"{scope}: switch {command.primary} -> {command.target} started"
    elif action == "rollback":
        said = mark(out, scope, "rolled_back", command.reason or "operator rollback")
    else:
        said = f"{scope}: switch cleared" if out["switches"].pop(scope, None) else "nothing to clear"
    return recorded(out, at, action, scope if command.model else command.target or "", said), said


def mark(doc: Doc, scope: str, phase: str, reason: str, switch_id: str | None = None) -> str:
    """Set a running switch's phase (in place); what happened, in words."""
    switch = doc["switches"].get(scope)
    if switch is None or (switch_id is not None and switch["id"] != switch_id):
        return f"{scope}: no such switch"
    if switch["phase"] != "running":
        return f"{scope}: switch already {switch['phase']}"
    switch["phase"], switch["reason"] = phase, reason[:300]
    return f"{scope}: switch {phase.replace('_', ' ')}: {reason}"[:300]


def recorded(doc: Doc, at: float, action: str, scope: str, said: str) -> Doc:
    doc["version"] = int(doc["version"]) + 1
    doc["history"] = [*doc["history"], {"at": at, "action": action, "scope": scope, "result": said}][-MAX_HISTORY:]
    return doc


def switch_for(doc: Mapping[str, Any], contract: RequestContract) -> tuple[str, Mapping[str, Any]] | None:
    """The switch that governs this request (its scenario's, else its model's), with its scope."""
    return switch_of(doc, contract.model, contract.scenario)


def switch_of(doc: Mapping[str, Any], model: str, scenario: str) -> tuple[str, Mapping[str, Any]] | None:
    """The switch that governs a request for `model` in `scenario`, with its scope."""
    for scope in (scope_of(model, scenario), model):
        switch = doc.get("switches", {}).get(scope)
        if switch is not None:
            return scope, switch
    return None


def unavailable(doc: Mapping[str, Any], contract: RequestContract, targets: Iterable[Target]) -> dict[str, str]:
    """Target id → why the operator keeps it out of this request's plan (drained, or not the pin)."""
    drains: Mapping[str, Any] = doc.get("drains", {})
    pins: Mapping[str, Any] = doc.get("pins", {})
    pin = pins.get(scope_of(contract.model, contract.scenario)) or pins.get(contract.model)
    out: dict[str, str] = {}
    for target in targets:
        if target.endpoint in drains:
            out[target.id] = f"drained by the operator: {drains[target.endpoint]['reason']}"[:200]
        elif pin is not None and target.endpoint != pin["target"]:
            out[target.id] = f"the operator pinned {contract.model} to {pin['target']}"
    return out
