"""Offline policy replay: re-run a new policy's contract pipeline over recorded decisions.

    replay(records, blobs, policy, registry, tenants) -> ReplayReport

Each recorded request's contract is rebuilt under the new policy (router/learning/decision_inputs.py: the
body's needs as recorded, the scenario's terms re-derived from the recorded contract headers, the
schemas from their blobs) and run through `run_pipeline` against the new config's targets, with the
targets' availability as the record's snapshot saw it (a target out of routing then is out now; a
provider the snapshot does not know, e.g. one the new config adds, counts as reachable).

Pressure is not replayed (the record holds no engine readings), so the new target follows the
recorded route:
* the recorded plan's first target was local (local had room, or it waited): the new local target
  when the new pipeline keeps one, else the best new cloud target;
* it was a cloud target while local was capable and available (a burst): the best new cloud target,
  else the new local one (it would have waited);
* it was a cloud target because local could not serve it: the new local target when the new policy
  makes local capable (assumed to have room), else the best new cloud target.
The recorded first target is the first attempt's (skipped or not), else the head of the recorded route's tier.

Per request the report gives the old and new target, an outcome (`same`, `moved`,
`no_capable_model`, `rejected` — the new policy refuses the recorded headers, `unavailable` — capable
but nothing reachable, `skipped` — the record cannot be replayed, with why), the candidates the new
pipeline removes that the recorded one did not (target, filter, reason) and the expected cost of the
old and new target (estimated from the contract's tokens at the new config's prices). Guards
(`ReplayGuards`) turn the summary into a verdict: `tripped` lists each guard that failed.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from router.errors import RequestError
from router.learning.decision_inputs import replay_contract
from router.request.auth import TenantPolicy
from router.routing.capabilities import Registry, Target, estimate_cost_usd, is_local_id
from router.routing.pipeline import Removal, run_pipeline
from router.routing.plugins import TargetState
from router.routing.policy import Policy

Outcome = Literal["same", "moved", "no_capable_model", "rejected", "unavailable", "skipped"]
CHANGED: frozenset[str] = frozenset({"moved", "no_capable_model", "rejected", "unavailable"})


@dataclass(frozen=True)
class ReplayGuards:
    max_changed_pct: float = 10.0  # of the replayed requests whose outcome is not `same`
    max_no_capable: int = 0  # requests that become no_capable_model


@dataclass(frozen=True, slots=True)  # one per recorded request: slots keep the report near the log's size
class RequestReplay:
    request_id: str
    outcome: Outcome
    old_target: str | None
    new_target: str | None = None
    removed: tuple[Removal, ...] = ()  # removed now, not in the record
    old_cost_usd: float | None = None
    new_cost_usd: float | None = None
    why: str = ""  # for rejected / no_capable_model / unavailable / skipped

    def __post_init__(self) -> None:
        object.__setattr__(self, "why", sys.intern(self.why))  # thousands of records share a few reasons

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "outcome": self.outcome,
            "old_target": self.old_target,
            "new_target": self.new_target,
            "removed": [r.to_dict() for r in self.removed],
            "old_cost_usd": self.old_cost_usd,
            "new_cost_usd": self.new_cost_usd,
            "why": self.why,
        }


@dataclass(frozen=True)
class ReplayReport:
    policy_version: str
    requests: tuple[RequestReplay, ...]
    guards: ReplayGuards
    malformed: int = 0  # log lines the reader could not use
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def replayed(self) -> tuple[RequestReplay, ...]:
        return tuple(r for r in self.requests if r.outcome != "skipped")

    @property
    def changed(self) -> tuple[RequestReplay, ...]:
        return tuple(r for r in self.requests if r.outcome in CHANGED)

    @property
    def changed_pct(self) -> float:
        return 100.0 * len(self.changed) / len(self.replayed) if self.replayed else 0.0

    def cloud_share(self, new: bool) -> float:
        """Share of the replayed requests whose (old / new) target is a cloud one."""
        targets = [r.new_target if new else r.old_target for r in self.replayed]
        return sum(1 for t in targets if t is not None and not is_local_id(t)) / len(targets) if targets else 0.0

    def cost(self, new: bool) -> float:
        costs = [r.new_cost_usd if new else r.old_cost_usd for r in self.replayed]
        return sum(c for c in costs if c is not None)

    @property
    def tripped(self) -> tuple[str, ...]:
        out = []
        if self.changed_pct > self.guards.max_changed_pct:
            out.append(f"{self.changed_pct:.1f}% of requests change (guard: at most {self.guards.max_changed_pct:g}%)")
        no_capable = sum(1 for r in self.requests if r.outcome == "no_capable_model")
        if no_capable > self.guards.max_no_capable:
            out.append(f"{no_capable} requests become no_capable_model (guard: at most {self.guards.max_no_capable})")
        if not self.replayed:
            out.append("no request could be replayed")
        return tuple(out)

    def summary(self) -> dict[str, Any]:
        outcomes = Counter(r.outcome for r in self.requests)
        moves = Counter(f"{r.old_target} -> {r.new_target}" for r in self.requests if r.outcome == "moved")
        removed: Counter[str] = Counter()
        examples: dict[str, str] = {}
        for r in self.requests:
            for rem in r.removed:
                key = f"{rem.target} by {rem.filter}"
                removed[key] += 1
                examples.setdefault(key, rem.reason)
        return {
            "policy_version": self.policy_version,
            "requests": len(self.requests),
            "replayed": len(self.replayed),
            "malformed_lines": self.malformed,
            "outcomes": dict(sorted(outcomes.items())),
            "changed": len(self.changed),
            "changed_pct": round(self.changed_pct, 2),
            "moves": dict(moves.most_common()),
            "newly_removed": {k: {"requests": n, "reason": examples[k]} for k, n in removed.most_common()},
            "cloud_share": {"old": round(self.cloud_share(False), 4), "new": round(self.cloud_share(True), 4)},
            "expected_cost_usd": {"old": round(self.cost(False), 8), "new": round(self.cost(True), 8)},
            "guards": {"max_changed_pct": self.guards.max_changed_pct, "max_no_capable": self.guards.max_no_capable},
            "tripped": list(self.tripped),
            "notes": list(self.notes),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary(), "requests": [r.to_dict() for r in self.requests]}


def _old_target(record: Mapping[str, Any]) -> str | None:
    attempts = record.get("attempts") or []
    if attempts and isinstance(attempts[0], Mapping) and isinstance(attempts[0].get("target"), str):
        return str(attempts[0]["target"])
    tiers = record.get("tiers") or [[], []]
    tier = tiers[1] if record.get("route") == "cloud" and len(tiers) > 1 else tiers[0]
    return str(tier[0]) if tier else None


def _states(targets: Iterable[Target], snapshot: Mapping[str, Any] | None) -> dict[str, TargetState]:
    if snapshot is None:
        return {}
    reachable = set(snapshot.get("available_providers") or ())
    known = {tid.partition("/")[0].removeprefix("cloud:") for tid in snapshot.get("targets") or {}}
    down = set(snapshot.get("unavailable") or {})
    states = {}
    for t in targets:
        up = t.kind == "local" or t.provider in reachable or t.provider not in known
        states[t.id] = TargetState(available=up and t.id not in down)
    return states


def _cost(registry: Registry, target_id: str | None, prompt: int, output: int) -> float | None:
    target = registry.get(target_id) if target_id else None
    return None if target is None else estimate_cost_usd(target.caps, prompt, output)


def _recorded_local_capable(record: Mapping[str, Any]) -> bool:
    tiers = record.get("tiers") or []
    return bool(tiers and tiers[0])


_NOT_REPLAYABLE = (KeyError, TypeError, ValueError, AttributeError, IndexError)


def replay_one(
    record: Mapping[str, Any],
    blobs: Mapping[str, Mapping[str, Any]],
    policy: Policy,
    registry: Registry,
    tenants: Mapping[str, TenantPolicy] | None = None,
) -> RequestReplay:
    """One record's replay; a record without the fields a replay needs is `skipped`, never an exception."""
    raw_id = str(record.get("request_id", "?"))[:128]
    request_id = "".join(c if 32 <= ord(c) < 127 else "?" for c in raw_id)  # printed: no terminal escapes
    try:
        return _replay_one(request_id, record, blobs, policy, registry, tenants)
    except RequestError as exc:
        return RequestReplay(request_id, "rejected", _safe_old(record), why=f"{exc.code}: {exc.message}"[:300])
    except _NOT_REPLAYABLE as exc:
        why = f"record not replayable: {type(exc).__name__} {exc}"[:300]
        return RequestReplay(request_id, "skipped", _safe_old(record), why=why)


def _replay_one(
    request_id: str,
    record: Mapping[str, Any],
    blobs: Mapping[str, Mapping[str, Any]],
    policy: Policy,
    registry: Registry,
    tenants: Mapping[str, TenantPolicy] | None,
) -> RequestReplay:
    old = _old_target(record)
    recorded = record["contract"]
    quoted = [i for i in [recorded.get("json_schema_id"), *(recorded.get("tool_schema_ids") or {}).values()] if i]
    found = {str(i): blobs.get(str(i)) for i in quoted}  # only the blobs it quotes: linear in the log
    schemas = {i: b.get("body") for i, b in found.items() if b is not None and b.get("kind") == "schema"}
    if len(schemas) < len(found):
        return RequestReplay(request_id, "skipped", old, why="a schema it quotes is not in the log")
    contract = replay_contract(recorded, schemas, policy, tenants)
    targets = registry.for_alias(contract.model)
    snap = blobs.get(str(record.get("snapshot_id") or ""))
    states = _states(targets, snap.get("body") if snap is not None and snap.get("kind") == "snapshot" else None)
    result = run_pipeline(contract, targets, states, policy)
    old_removed = {
        (c.get("target"), c.get("filter"))
        for c in record.get("candidates") or []
        if isinstance(c, Mapping) and c.get("status") == "removed"
    }
    removed = tuple(r for r in result.removed if (r.target, r.filter) not in old_removed)
    tokens = (contract.est_prompt_tokens, contract.max_output_tokens)
    old_cost = _cost(registry, old, *tokens)
    if not result.capable:
        why = "; ".join(f"{r.target}: {r.reason}" for r in result.removed)[:300] or "no target for the model"
        return RequestReplay(request_id, "no_capable_model", old, None, removed, old_cost, None, why)
    local = result.tiers[0][0] if result.tiers[0] else None
    cloud = result.tiers[1][0] if result.tiers[1] else None
    if old is not None and is_local_id(old):
        new = local or cloud
    elif _recorded_local_capable(record):
        new = cloud or local
    else:
        new = local or cloud
    if new is None:
        why = "capable targets are all out of routing in the recorded snapshot"
        return RequestReplay(request_id, "unavailable", old, None, removed, old_cost, None, why)
    outcome: Outcome = "same" if new == old else "moved"
    return RequestReplay(request_id, outcome, old, new, removed, old_cost, _cost(registry, new, *tokens))


def _safe_old(record: Mapping[str, Any]) -> str | None:
    try:
        return _old_target(record)
    except _NOT_REPLAYABLE:
        return None


def replay(
    records: Iterable[Mapping[str, Any]],
    blobs: Mapping[str, Mapping[str, Any]],
    policy: Policy,
    registry: Registry,
    *,
    tenants: Mapping[str, TenantPolicy] | None = None,
    guards: ReplayGuards = ReplayGuards(),
    malformed: int = 0,
    notes: Iterable[str] = (),
) -> ReplayReport:
    requests = tuple(replay_one(r, blobs, policy, registry, tenants) for r in records)
    return ReplayReport(policy.version, requests, guards, malformed, tuple(notes))
