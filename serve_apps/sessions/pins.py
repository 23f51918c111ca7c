"""Where sessions are pinned: one table shared by every gateway replica, and each replica's cache of it.

`PinTable` maps a pin key (tenant, model alias, session id: router/sessions/session_id.py) to the session's
record — its target id, when it was pinned there, its turns and switches, its state anchor
(router/sessions/anchor.py, at most `sessions.anchor.max_bytes`) and the anchor's label (router/sessions/carried.py:
the strictest constraints of the turns it came from, JSON; every write joins it with the stored
one, so it only gets stricter). It holds at most `max_sessions` records, evicted per tenant (the
least recently used of the tenant holding the most: router/sessions/tenant_lru.py), and forgets one unused
for `ttl_s` (`sessions.ttl_s`).

In a deployment the table lives in a named, detached Ray actor on the head node
(serve_apps/sessions/actor.py, like the telemetry board and the breaker exchange), so pins survive a
gateway replica's restart and every replica sees the same ones. `record` is a compare-and-set: it
moves a pin only from the target the caller saw, so two replicas that pin a new session at once
agree on the first one's target from the next turn on. `set_anchor` replaces the anchor of a session
still pinned to the target that answered, without counting a turn: a streamed answer's text is known
only when the stream ends, after its turn was stored.

`PinClient` is a gateway replica's side: it reuses a record it read for `sessions.cache_s` (a
switch made by another replica is seen within that bound), and a table that does not answer within
`timeout_s` costs the request its pin, never the request itself (logged; the record says so).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from router.sessions.carried import from_json
from router.sessions.session_id import tenant_of_key
from router.sessions.tenant_lru import TenantLru

log = logging.getLogger("spillover.sessions")

Record = dict[str, Any]


class PinTable:
    def __init__(
        self, clock: Callable[[], float] = time.time, ttl_s: float = 3600, max_sessions: int = 100_000
    ) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._records: TenantLru[Record] = TenantLru(max_sessions, tenant_of_key)

    def __len__(self) -> int:
        return len(self._records)

    def held(self, tenant: str) -> int:
        """The records one tenant holds ("" without auth)."""
        return self._records.held(tenant)

    def _live(self, key: str) -> Record | None:
        record = self._records.peek(key)
        if record is None:
            return None
        if self._clock() - record["used_at"] > self._ttl_s:
            self._records.pop(key)
            return None
        return record

    def get(self, key: str) -> Record | None:
        if self._live(key) is None:
            return None
        return dict(self._records.get(key) or {})

    def record(
        self, key: str, expected: str | None, target: str, anchor: Mapping[str, Any] | None, label: Mapping[str, Any]
    ) -> Record:
        """One answered turn on `target`, whose context is labelled `label` (router/sessions/carried.py); the pin
        moves only if it still points at `expected` (None: no pin). Returns the stored record (another
        replica's pin when it got there first: its anchor stands, the label is joined all the same)."""
        now = self._clock()
        current = self._live(key)
        if current is not None and current["target"] != expected:  # moved (or pinned) meanwhile by another replica
            current = {**current, "label": _joined(key, current.get("label"), label)}
            self._records.put(key, current)
            return dict(current)
        if current is None:
            current = {"target": target, "since": now, "turns": 0, "switches": 0, "anchor": {}}
        elif current["target"] != target:
            current = {**current, "target": target, "since": now, "switches": current["switches"] + 1}
        current = {**current, "turns": current["turns"] + 1, "used_at": now}
        current["label"] = _joined(key, current.get("label"), label)
        if anchor is not None:
            current["anchor"] = dict(anchor)
        self._records.put(key, current)
        return dict(current)

    def set_anchor(self, key: str, target: str, anchor: Mapping[str, Any], label: Mapping[str, Any]) -> bool:
        """The anchor of a turn whose answer came after its pin was stored (a stream's); only while the
        session is still pinned to `target`. False when it is not (moved, or forgotten)."""
        current = self._live(key)
        if current is None or current["target"] != target:
            return False
        joined = _joined(key, current.get("label"), label)
        self._records.put(key, {**current, "anchor": dict(anchor), "label": joined})
        return True

    def reset(self) -> int:
        return self._records.clear()


def _joined(key: str, stored: Any, label: Mapping[str, Any]) -> dict[str, Any]:
    """The stored label joined with a turn's (a stored one that cannot be read counts as the strictest)."""
    tenant = tenant_of_key(key) or None
    new = from_json(label, tenant)
    return new.to_json() if stored is None else from_json(stored, tenant).join(new).to_json()


Get = Callable[[str], Awaitable[Record | None]]
Put = Callable[[str, str | None, str, Mapping[str, Any] | None, Mapping[str, Any]], Awaitable[Record]]
SetAnchor = Callable[[str, str, Mapping[str, Any], Mapping[str, Any]], Awaitable[bool]]


def local_pins(table: PinTable) -> tuple[Get, Put, SetAnchor]:
    """The same calls over an in-process table (a gateway without Ray, and the unit tests)."""

    async def get(key: str) -> Record | None:
        return table.get(key)

    async def put(
        key: str, expected: str | None, target: str, anchor: Mapping[str, Any] | None, label: Mapping[str, Any]
    ) -> Record:
        return table.record(key, expected, target, anchor, label)

    async def set_anchor(key: str, target: str, anchor: Mapping[str, Any], label: Mapping[str, Any]) -> bool:
        return table.set_anchor(key, target, anchor, label)

    return get, put, set_anchor


class PinClient:
    def __init__(
        self,
        get: Get,
        put: Put,
        set_anchor: SetAnchor | None = None,
        *,
        cache_s: float,
        clock: Callable[[], float] = time.monotonic,
        timeout_s: float = 1.0,
        max_cached: int = 10_000,
    ) -> None:
        self._get = get
        self._put = put
        self._set_anchor = set_anchor
        self._cache_s = cache_s
        self._clock = clock
        self._timeout_s = timeout_s
        self._max_cached = max_cached
        self._cache: OrderedDict[str, tuple[float, Record | None]] = OrderedDict()
        self.failures = 0

    def _keep(self, key: str, record: Record | None) -> None:
        self._cache[key] = (self._clock(), record)
        self._cache.move_to_end(key)
        while len(self._cache) > self._max_cached:
            self._cache.popitem(last=False)

    async def lookup(self, key: str) -> tuple[Record | None, bool]:
        """(the session's record or None, whether the table answered)."""
        cached = self._cache.get(key)
        if cached is not None and self._clock() - cached[0] < self._cache_s:
            return cached[1], True
        try:
            record = await asyncio.wait_for(self._get(key), self._timeout_s)
        except Exception as exc:  # noqa: BLE001 -- the table being away costs the pin, never the request
            self.failures += 1
            log.warning("session pin table unavailable: %s", type(exc).__name__)
            return None, False
        self._keep(key, record)
        return record, True

    async def record(
        self, key: str, expected: str | None, target: str, anchor: Mapping[str, Any] | None, label: Mapping[str, Any]
    ) -> Record | None:
        try:
            stored = await asyncio.wait_for(self._put(key, expected, target, anchor, label), self._timeout_s)
        except Exception as exc:  # noqa: BLE001 -- see lookup
            self.failures += 1
            log.warning("session pin not stored: %s", type(exc).__name__)
            self._cache.pop(key, None)
            return None
        self._keep(key, stored)
        return stored

    async def set_anchor(self, key: str, target: str, anchor: Mapping[str, Any], label: Mapping[str, Any]) -> bool:
        """Replace the anchor of a session still pinned to `target`, joining its label (False: not stored)."""
        if self._set_anchor is None:
            return False
        try:
            stored = await asyncio.wait_for(self._set_anchor(key, target, anchor, label), self._timeout_s)
        except Exception as exc:  # noqa: BLE001 -- see lookup
            self.failures += 1
            log.warning("session anchor not stored: %s", type(exc).__name__)
            return False
        cached = self._cache.get(key)
        if stored and cached is not None and cached[1] is not None and cached[1].get("target") == target:
            joined = _joined(key, cached[1].get("label"), label)
            self._cache[key] = (cached[0], {**cached[1], "anchor": dict(anchor), "label": joined})
        return bool(stored)
