"""Decision records and feedback every gateway replica can answer for, through the shared store.

`SharedDecisions` is the gateway's `DecisionStore` (router/learning/decision.py): records are kept in the
replica's memory as before, and each final record is also written to the shared store
(serve_apps/state/store.py) under its owner and request id for `gateway.decisions_ttl_s`, off the request
path (serve_apps/state/writes.py: a failed write is logged and counted, never raised; a record over the
store's `max_value_bytes` is kept by this replica only). `find(id, owner)` answers from memory first,
then from the shared store — always the owner's own record: the key holds the owner, and the value says
it again. So `GET /v1/spillover/decisions/{id}`, `spillover explain` and feedback find a record whichever
replica answered the request. A value that is not such a record (not JSON, another owner's or request's, a
shape the route cannot render) reads as no record: the caller answers 404, never 500.

`claim_feedback` makes "one verdict per request and source kind" (router/learning/feedback.py) hold across
replicas: the first report of a kind takes its key with `put_if_absent`, a second one (on any replica)
finds it taken. A store that does not answer decides nothing: the replica's own feedback store does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from router.learning.decision import DecisionRecord, DecisionStore
from serve_apps.state.store import SharedStore
from serve_apps.state.writes import BackgroundWrites, owned_key, read

log = logging.getLogger("spillover.decisions")


def record_key(owner: str, request_id: str) -> str:
    return owned_key("decision", owner, request_id)


class SharedDecisions(DecisionStore):
    def __init__(
        self,
        store: SharedStore,
        *,
        ttl_s: float,
        max_records: int = 1000,
        sink: Callable[[str], None] | None = None,
        max_bytes: int | None = None,
    ) -> None:
        super().__init__(max_records, sink, max_bytes=max_bytes, on_final=self._share)
        self.ttl_s = ttl_s
        self.writes = BackgroundWrites(store, what="decision record")

    def _share(self, owner: str, record: DecisionRecord, line: str) -> None:
        value = f'{{"owner":{json.dumps(owner)},"record":{line}}}'.encode()
        self.writes.put(record_key(owner, record.request_id), value, self.ttl_s)

    async def find(self, request_id: str, owner: str) -> DecisionRecord | None:
        """`owner`'s record for `request_id`: this replica's, else the shared store's."""
        local = self.get(request_id, owner)
        if local is not None:
            return local
        raw = await read(self.writes.store, record_key(owner, request_id), "decision record")
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("owner") != owner:  # never another owner's, whatever the key held
                return None
            record = DecisionRecord.from_dict(data["record"])
            if record.request_id != request_id or not isinstance(record.contract, dict):
                return None
            record.to_json()  # what the route renders: a value that does not render is no record
            return record
        except Exception as exc:  # noqa: BLE001 - whatever the store held, an unreadable record is a 404, never a 500
            log.warning("decision record %s in the shared store unreadable (%s)", request_id[:128], type(exc).__name__)
            return None

    async def claim_feedback(self, request_id: str, owner: str, kind: str, value: bytes) -> bool:
        """True when this is the first report of `kind` on `owner`'s request, cluster-wide."""
        key = owned_key("feedback", owner, f"{kind}:{request_id}")
        try:
            return await self.writes.store.put_if_absent(key, value, self.ttl_s) is None
        except Exception as exc:  # noqa: BLE001 - the replica's own feedback store still decides
            log.warning("feedback not checked with the shared store (%s): %s", type(exc).__name__, exc)
            return True


async def find_record(store: DecisionStore | None, request_id: str, owner: str) -> DecisionRecord | None:
    """The owner's record from `store` (and its shared store, when it has one)."""
    if store is None:
        return None
    if isinstance(store, SharedDecisions):
        return await store.find(request_id, owner)
    return store.get(request_id, owner)
