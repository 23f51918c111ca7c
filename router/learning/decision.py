"""Decision records: why a request went where it went, and what it cost.

A `DecisionRecord` quotes the policy version, the request's contract, every candidate with its
filter reason or its scores, the tiers, the chosen target and every attempt — failed ones too,
with their cost, because a retried request is paid for twice. Records are frozen: `with_attempt`
and `finished` return new ones. Timestamps come from the clock the caller injects.

`DecisionStore` keeps the last `max_records` records by request id (oldest evicted), and at most
`max_bytes` of them measured as their JSON lines (a record quotes the client's schema, so a few
large requests must not pin gigabytes: the oldest go first, the newest is always kept), and writes
each stored record as one JSON line to an optional sink (a callable the caller wires to a file),
preceded the first time by a line for each schema or snapshot blob it quotes (router/learning/decision_inputs.py),
and hands each final record with its owner to an optional `on_final` hook (the gateway's copy in its
shared store, serve_apps/learning/shared_records.py; a hook that raises is counted like the sink).
A sink that raises is logged and counted (`sink_failures`): the record stays stored and the
request it describes is never failed by its log. A request that has not ended when it is first
stored (a stream: the dispatcher returns at its first byte) is `put(final=False)` — stored, not
yet logged — and `finalise`d with its final version when it ends, which the sink then gets once.

Records have an owner (the tenant whose request made them; "" without auth). The gateway
`claim`s a request id for its owner before dispatching and `release`s it after; a claim is
refused while another owner holds that id (a stored record or a request in flight), so an id a
client chooses can never overwrite another tenant's record, and `get(id, owner)` answers only the
owner's own records.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import msgspec

from router.learning.decision_inputs import Blob, BlobLog, compact_contract
from router.request.contract import RequestContract
from router.routing.capabilities import Target, estimate_cost_usd
from router.routing.pipeline import PipelineResult
from router.routing.policy import Policy

log = logging.getLogger("spillover.decisions")

# a stream's attempt is "streaming" from the dispatcher's return until its stream ends: then "ok", "cut"
# (it failed after its first byte), "cancelled" (the client went away) or "contract_violation"
Outcome = Literal["ok", "error", "contract_violation", "timeout", "cancelled", "skipped", "streaming", "cut"]
CandidateStatus = Literal["removed", "unavailable", "ranked"]


@dataclass(frozen=True)
class Attempt:
    target: str
    outcome: str  # one of Outcome
    latency_s: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None  # None: the target has no configured prices
    error: str | None = None  # the error code when the attempt failed
    usage: str | None = None  # where the tokens come from: "reported" by the target, or "counted" (streams)
    contract: str | None = None  # the output contract's note on an answer that passed: "repaired", or the
    # summary of a violation let through (L2: "schema: 1 error")
    contract_errors: tuple[str, ...] = ()  # that violation's errors (bounded as in router/output/output_contract.py)

    @classmethod
    def priced(
        cls,
        target: Target,
        outcome: str,
        latency_s: float,
        prompt_tokens: int,
        completion_tokens: int,
        error: str | None = None,
    ) -> Attempt:
        """An attempt costed with the target's configured prices (local targets cost 0)."""
        cost = estimate_cost_usd(target.caps, prompt_tokens, completion_tokens)
        return cls(target.id, outcome, latency_s, prompt_tokens, completion_tokens, cost, error)


@dataclass(frozen=True)
class Candidate:
    target: str
    status: str  # one of CandidateStatus
    filter: str | None = None
    reason: str | None = None
    scores: Mapping[str, Mapping[str, float]] | None = None  # scorer -> {raw, score, weight}
    total: float | None = None


@dataclass(frozen=True)
class DecisionRecord:
    request_id: str
    policy_version: str
    contract: Mapping[str, Any]
    candidates: tuple[Candidate, ...]
    tiers: tuple[tuple[str, ...], ...]
    started_at: float
    chosen: str | None = None
    attempts: tuple[Attempt, ...] = ()
    finished_at: float | None = None
    health: Mapping[str, str] = field(default_factory=dict)  # target / domain -> health or breaker state
    route: str | None = None  # what was executed: local | cloud | wait (a wait that never ended)
    reason: str = ""  # why (the burst decision, a fail-over, or how the request ended)
    waited_s: float = 0.0  # time in the waiting room for local capacity
    replans: int = 0  # plans made while waiting; the candidates and tiers are those of the last one
    traffic: str = ""  # the live weight (moved or kept) and the graded switch (step, share, primary or standby)
    # what happened besides the attempts: a Retry-After waited out or not, a stream's skipped events,
    # a missing [DONE], a continuation and its splice point (kind + facts, plain JSON values)
    events: tuple[Mapping[str, Any], ...] = ()
    session: Mapping[str, Any] | None = None  # pin, switch, anchor and compression (serve_apps/sessions/turns.py)
    snapshot_id: str = ""  # the plan's capability / health snapshot, a blob (router/learning/decision_inputs.py)
    blobs: Mapping[str, Blob] = field(default_factory=dict, compare=False)  # schemas, snapshot: logged once

    @classmethod
    def from_pipeline(
        cls,
        request_id: str,
        policy: Policy,
        contract: RequestContract,
        result: PipelineResult,
        *,
        clock: Callable[[], float],
        unavailable: Mapping[str, str] | None = None,
        health: Mapping[str, str] | None = None,
        snapshot: tuple[str, Mapping[str, Any]] | None = None,
    ) -> DecisionRecord:
        """`unavailable`: why a target was unavailable (its health state or breaker), by target id;
        `snapshot`: (id, body) of `router.learning.decision_inputs.plan_snapshot`."""
        removed = {r.target: r for r in result.removed}
        why_unavailable = unavailable or {}
        candidates = []
        for target_id in result.candidates:
            if target_id in removed:
                r = removed[target_id]
                candidates.append(Candidate(target_id, "removed", r.filter, r.reason))
            elif target_id in result.unavailable:
                reason = why_unavailable.get(target_id, "unavailable (health or breaker)")
                candidates.append(Candidate(target_id, "unavailable", reason=reason))
            else:
                card = result.scores[target_id]
                scores = {n: {"raw": s.raw, "score": s.clamped, "weight": s.weight} for n, s in card.scores.items()}
                candidates.append(Candidate(target_id, "ranked", scores=scores, total=card.total))
        compact, blobs = compact_contract(contract)
        if snapshot is not None:
            blobs[snapshot[0]] = {"kind": "snapshot", "body": snapshot[1]}
        return cls(
            request_id=request_id,
            policy_version=policy.version,
            contract=compact,
            candidates=tuple(candidates),
            tiers=tuple(tuple(t) for t in result.tiers),
            started_at=clock(),
            health=dict(health or {}),
            snapshot_id=snapshot[0] if snapshot is not None else "",
            blobs=blobs,
        )

    def with_attempt(self, attempt: Attempt) -> DecisionRecord:
        return replace(self, attempts=(*self.attempts, attempt))

    def finished(self, chosen: str | None, *, clock: Callable[[], float]) -> DecisionRecord:
        """`chosen`: the target whose answer the client got (None: none did)."""
        return replace(self, chosen=chosen, finished_at=clock())

    @property
    def total_cost_usd(self) -> float:
        """Every attempt's known cost, failed attempts included."""
        return sum(a.cost_usd for a in self.attempts if a.cost_usd is not None)

    def _fields(self) -> dict[str, Any]:
        """What `to_dict` and `to_json` render: every field but the blobs (logged once, apart), and the total."""
        data = {name: getattr(self, name) for name in _RECORD_FIELDS}
        data["total_cost_usd"] = self.total_cost_usd
        return data

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (dataclasses as dicts, tuples as lists), as `to_json` writes them."""
        data: dict[str, Any] = msgspec.to_builtins(self._fields(), enc_hook=_json_value)
        return data

    def to_json(self) -> str:
        """One JSON line, keys sorted: msgspec walks the dataclasses itself, ~10x faster than a Python copy and
        `json.dumps` (every request stores one). Non-ASCII text stays UTF-8; a NaN would be null."""
        return _ENCODER.encode(self._fields()).decode()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DecisionRecord:
        return cls(
            request_id=data["request_id"],
            policy_version=data["policy_version"],
            contract=data["contract"],
            candidates=tuple(Candidate(**c) for c in data["candidates"]),
            tiers=tuple(tuple(t) for t in data["tiers"]),
            started_at=data["started_at"],
            chosen=data.get("chosen"),
            attempts=tuple(_attempt(a) for a in data.get("attempts", ())),
            finished_at=data.get("finished_at"),
            health=dict(data.get("health") or {}),
            route=data.get("route"),
            reason=data.get("reason") or "",
            waited_s=float(data.get("waited_s") or 0.0),
            replans=int(data.get("replans") or 0),
            traffic=str(data.get("traffic") or ""),
            events=tuple(dict(e) for e in data.get("events") or ()),
            session=data.get("session"),
            snapshot_id=str(data.get("snapshot_id") or ""),
        )

    @classmethod
    def from_json(cls, line: str) -> DecisionRecord:
        return cls.from_dict(json.loads(line))


def _json_value(value: Any) -> Any:
    """What msgspec does not encode itself: read-only mappings (MappingProxyType) and sets."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, frozenset | set):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


_ENCODER = msgspec.json.Encoder(enc_hook=_json_value, order="sorted")
_RECORD_FIELDS = tuple(f.name for f in fields(DecisionRecord) if f.name != "blobs")


def _attempt(data: Mapping[str, Any]) -> Attempt:
    return Attempt(**{**data, "contract_errors": tuple(data.get("contract_errors") or ())})


class DecisionStore:
    """The last `max_records` decision records by request id; `put` of a known id replaces it
    when the owner is the same (see the module docstring for owners and claims)."""

    def __init__(
        self,
        max_records: int = 1000,
        sink: Callable[[str], None] | None = None,
        *,
        max_bytes: int | None = None,
        on_final: Callable[[str, DecisionRecord, str], None] | None = None,
    ) -> None:
        if max_records < 1 or (max_bytes is not None and max_bytes < 1):
            raise ValueError("max_records and max_bytes must be >= 1")
        self._max = max_records
        self._max_bytes = max_bytes
        self._sink = sink
        self._on_final = on_final  # (owner, record, its JSON line) of each final record: a copy kept elsewhere
        self._records: OrderedDict[str, tuple[str, DecisionRecord]] = OrderedDict()
        self._sizes: dict[str, int] = {}  # request id -> bytes of its JSON line
        self.bytes_kept = 0
        self._claims: dict[str, tuple[str, int]] = {}  # request id -> (owner, requests in flight)
        self.sink_failures = 0
        self._blob_log = BlobLog()

    @property
    def max_records(self) -> int:
        return self._max

    def _owner_of(self, request_id: str) -> str | None:
        claim = self._claims.get(request_id)
        if claim is not None:
            return claim[0]
        stored = self._records.get(request_id)
        return None if stored is None else stored[0]

    def claim(self, request_id: str, owner: str) -> bool:
        """Hold `request_id` for `owner` until `release`; False when another owner holds it."""
        held = self._owner_of(request_id)
        if held is not None and held != owner:
            return False
        count = self._claims.get(request_id, (owner, 0))[1]
        self._claims[request_id] = (owner, count + 1)
        return True

    def release(self, request_id: str, owner: str) -> None:
        claim = self._claims.get(request_id)
        if claim is None or claim[0] != owner:
            return
        if claim[1] <= 1:
            del self._claims[request_id]
        else:
            self._claims[request_id] = (owner, claim[1] - 1)

    def put(self, record: DecisionRecord, *, final: bool = True) -> None:
        """Store under the id's claimed owner ("" unclaimed); never over another owner's record.
        `final=False`: the request has not ended (a stream still running): the record is stored
        but written to the sink only by `finalise`, so the log holds the outcome, not a snapshot."""
        claim = self._claims.get(record.request_id)
        owner = claim[0] if claim is not None else ""
        stored = self._records.get(record.request_id)
        if stored is not None and stored[0] != owner:
            log.warning("decision record %s not stored: the id belongs to another owner", record.request_id)
            return
        self._store(owner, record, final)

    def finalise(self, record: DecisionRecord) -> None:
        """The final version of a record `put` with `final=False`: it replaces the stored one
        under that one's owner (the claim is long released when a stream ends) and goes to the
        sink. When the id now holds a later request's record (or none), only the sink gets it."""
        stored = self._records.get(record.request_id)
        if stored is not None and stored[1].started_at == record.started_at:
            self._store(stored[0], record, True)
        else:
            self._write(record, record.to_json())

    def _store(self, owner: str, record: DecisionRecord, final: bool) -> None:
        self._records.pop(record.request_id, None)
        line = record.to_json()
        self.bytes_kept += len(line) - self._sizes.get(record.request_id, 0)
        self._sizes[record.request_id] = len(line)
        self._records[record.request_id] = (owner, record)
        max_bytes = self._max_bytes if self._max_bytes is not None else float("inf")
        while len(self._records) > self._max or (self.bytes_kept > max_bytes and len(self._records) > 1):
            evicted, _ = self._records.popitem(last=False)
            self.bytes_kept -= self._sizes.pop(evicted, 0)
        if final:
            self._write(record, line)
            self._hand_on(owner, record, line)

    def _hand_on(self, owner: str, record: DecisionRecord, line: str) -> None:
        if self._on_final is not None:
            try:
                self._on_final(owner, record, line)
            except Exception as exc:  # noqa: BLE001 - a copy that fails must not fail the request
                self.sink_failures += 1
                log.warning("decision record hand-on failed (%s): %s", type(exc).__name__, exc)

    def _write(self, record: DecisionRecord, line: str) -> None:
        if self._sink is not None:
            try:
                for blob_id, blob_line in self._blob_log.new_lines(record.blobs):
                    self._sink(blob_line)  # a schema or snapshot the record quotes, once
                    self._blob_log.written(blob_id)
                self._sink(line)
            except Exception as exc:  # noqa: BLE001 - a full disk or a bad path must not fail the request
                self.sink_failures += 1
                log.warning("decision log write failed (%s): %s", type(exc).__name__, exc)

    def amend(self, request_id: str, change: Callable[[DecisionRecord], DecisionRecord]) -> DecisionRecord | None:
        """Replace a stored record by `change(record)`, under the same owner (a stream's record, once
        the stream ended: its continuation, its repairs); None when the record is no longer stored.
        The sink gets the amended record as a new line (the last line of an id is its record)."""
        stored = self._records.get(request_id)
        if stored is None:
            return None
        owner, claim = stored[0], self._claims.get(request_id)
        if claim is not None and claim[0] != owner:
            return None  # the id is held by another owner now
        self._claims[request_id] = (owner, (claim[1] if claim is not None else 0) + 1)
        try:
            amended = change(stored[1])
            self.put(amended)
        finally:
            self.release(request_id, owner)
        return amended

    def get(self, request_id: str, owner: str | None = None) -> DecisionRecord | None:
        """The record for `request_id`; with `owner`, only when that owner's request made it."""
        stored = self._records.get(request_id)
        if stored is None or (owner is not None and stored[0] != owner):
            return None
        return stored[1]

    def recent(self, n: int | None = None) -> list[DecisionRecord]:
        """Newest last."""
        records = [record for _, record in self._records.values()]
        return records if n is None else records[-n:]

    def __len__(self) -> int:
        return len(self._records)
