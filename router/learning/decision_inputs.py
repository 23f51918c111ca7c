"""What a replay needs of one decision record, kept compactly.

A record's `contract` is `RequestContract.to_dict()` plus `inputs`: the contract headers the client
sent (x-business-scenario, x-spillover-level, ...), so a replay re-derives the scenario's terms under
another policy. JSON Schemas are not copied into every record: the contract names each by its content
id (`json_schema_id`, `tool_schema_ids`) and the record carries the bodies in `blobs`
(id -> {"kind": "schema", "body": ...}). The plan's snapshot — the capabilities of the request's
candidate targets, the providers the plan could reach, the targets out of routing and why, the health
and breaker states — is a blob too, quoted by the record's `snapshot_id`.

The decision log writes each blob once, as its own line before the first record that quotes it
(`BlobLog`; it remembers the last `max_ids` ids it wrote, so a schema seen again much later is
written again: harmless, ids are content hashes). Log lines:

    record   the record's JSON (no "kind" key)
    blob     {"kind": "schema" | "snapshot", "id": "<16 hex>", "body": ...}

Pure: no I/O. File reading is cluster/decision_log_reader.py; the replay itself router/learning/replay.py.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import fields, replace
from typing import Any

from router.request.auth import TenantPolicy, narrow_for_tenant
from router.request.contract import RequestContract, scenario_terms
from router.routing.capabilities import Capabilities, Target
from router.routing.policy import Policy

BLOB_KINDS = ("schema", "snapshot")
Blob = Mapping[str, Any]  # {"kind": ..., "body": ...}


def content_id(value: Any) -> str:
    """16 hex digits of the SHA-256 of the value's canonical JSON."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def compact_contract(contract: RequestContract) -> tuple[dict[str, Any], dict[str, Blob]]:
    """The record's contract (schemas replaced by their ids, the contract headers given) and the schema blobs."""
    data = contract.to_dict()
    blobs: dict[str, Blob] = {}
    schema = data.pop("json_schema", None)
    if schema is not None:
        schema_id = content_id(schema)
        blobs[schema_id] = {"kind": "schema", "body": schema}
        data["json_schema_id"] = schema_id
    tool_ids: dict[str, str] = {}
    for name, tool_schema in contract.tool_schemas.items():
        tool_ids[name] = content_id(tool_schema)
        blobs[tool_ids[name]] = {"kind": "schema", "body": tool_schema}
    if tool_ids:
        data["tool_schema_ids"] = tool_ids
    data["inputs"] = dict(contract.inputs)
    return data, blobs


def _caps(caps: Capabilities) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(caps):
        value = getattr(caps, f.name)
        out[f.name] = sorted(value) if isinstance(value, frozenset) else value
    return out


def plan_snapshot(
    targets: Iterable[Target],
    available_providers: Iterable[str],
    unavailable: Mapping[str, str],
    health: Mapping[str, str],
) -> tuple[str, dict[str, Any]]:
    """(id, body) of what the plan saw besides the contract: capabilities, reachable providers, health.
    The body is shared by every request that saw the same: read it, never change it."""
    key = (tuple(targets), tuple(sorted(available_providers)), tuple(unavailable.items()), tuple(health.items()))
    try:
        return _snapshot(key)
    except TypeError:  # an unhashable value somewhere: made afresh, not remembered
        return _snapshot.__wrapped__(key)


SnapshotKey = tuple[tuple[Target, ...], tuple[str, ...], tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]


@functools.lru_cache(maxsize=256)  # the inputs change when health or capabilities do, not per request
def _snapshot(key: SnapshotKey) -> tuple[str, dict[str, Any]]:
    targets, available, unavailable, health = key
    body = {
        "targets": {t.id: _caps(t.caps) for t in targets},
        "available_providers": list(available),
        "unavailable": dict(unavailable),
        "health": dict(health),
    }
    return content_id(body), body


class BlobLog:
    """Which blob ids the log has written (the last `max_ids`): each blob line goes out once."""

    def __init__(self, max_ids: int = 4096) -> None:
        self._max = max_ids
        self._seen: OrderedDict[str, None] = OrderedDict()

    def new_lines(self, blobs: Mapping[str, Blob]) -> list[tuple[str, str]]:
        """(id, line) for every blob not written yet; call `written(id)` once a line went out."""
        lines = []
        for blob_id, blob in blobs.items():
            if blob_id in self._seen:
                self._seen.move_to_end(blob_id)
                continue
            line = json.dumps({"kind": blob["kind"], "id": blob_id, "body": blob["body"]}, separators=(",", ":"))
            lines.append((blob_id, line))
        return lines

    def written(self, blob_id: str) -> None:
        self._seen[blob_id] = None
        while len(self._seen) > self._max:
            self._seen.popitem(last=False)


def replay_contract(
    recorded: Mapping[str, Any],
    schemas: Mapping[str, Any],
    policy: Policy,
    tenants: Mapping[str, TenantPolicy] | None = None,
) -> RequestContract:
    """The contract the request would get under `policy`: what its body asked for as recorded, the
    scenario's terms re-derived from the recorded contract headers (`InvalidRequest` when the new policy
    refuses them, e.g. a scenario it no longer has), narrowed by its tenant when `tenants` knows it.
    Raises KeyError / TypeError / ValueError for a record that does not have the recorded fields."""
    inputs = recorded.get("inputs")
    if not isinstance(inputs, Mapping):
        raise ValueError("the record has no contract inputs (recorded before replays were possible)")
    terms = scenario_terms({str(k).lower(): str(v) for k, v in inputs.items()}, policy)
    schema_id = recorded.get("json_schema_id")
    tool_ids = recorded.get("tool_schema_ids") or {}
    contract = RequestContract(
        model=str(recorded["model"]),
        needs_tools=bool(recorded["needs_tools"]),
        needs_parallel_tools=bool(recorded["needs_parallel_tools"]),
        needs_json_schema=bool(recorded["needs_json_schema"]),
        needs_json_mode=bool(recorded["needs_json_mode"]),
        needs_streaming=bool(recorded["needs_streaming"]),
        modalities=frozenset(str(m) for m in recorded["modalities"]),
        est_prompt_tokens=int(recorded["est_prompt_tokens"]),
        max_output_tokens=int(recorded["max_output_tokens"]),
        json_schema=schemas.get(schema_id) if isinstance(schema_id, str) else None,
        tool_schemas={str(n): schemas.get(str(i), {}) for n, i in dict(tool_ids).items()},
        **terms,
    )
    tenant = recorded.get("tenant")
    known = (tenants or {}).get(tenant) if isinstance(tenant, str) else None
    if known is not None:
        return narrow_for_tenant(contract, known)
    return replace(contract, tenant=tenant) if isinstance(tenant, str) else contract
