"""Server-side session history (`sessions.store: true`): the stored turns of each session.

`HistoryStore` keeps, per pin key (tenant, model alias, session: router/sessions/session_id.py), the session's
messages as router/sessions/history.py bounds them (`sessions.history_max_bytes` each) and their label
(router/sessions/carried.py: the strictest constraints of the turns they came from, JSON; every write joins
it with the stored one, so it only gets stricter while the session lives). It holds at most
`sessions.history_total_bytes` in all, evicted per tenant (the least recently used session of the
tenant holding the most bytes: router/sessions/tenant_lru.py), and forgets a session unused for
`sessions.ttl_s`. In a deployment it is a named, detached Ray actor on the head node next to the pin
table (serve_apps/sessions/actor.py), so every gateway replica reads the same history and label.

`HistoryClient` is a replica's side: no cache (each turn reads the newest history), and a store that
does not answer within `timeout_s` costs the turn its stored history, never the turn itself (the
record says so).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from router.sessions.carried import from_json
from router.sessions.session_id import tenant_of_key
from router.sessions.tenant_lru import TenantLru

log = logging.getLogger("spillover.sessions")

Messages = list[Any]
Stored = tuple[Messages, dict[str, Any] | None]  # the messages and their label (None: nothing stored)
Kept = tuple[float, Messages, dict[str, Any], int]  # used at, messages, label, bytes


class HistoryStore:
    def __init__(self, clock: Callable[[], float] = time.time, ttl_s: float = 3600, total_bytes: int = 1 << 28) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._total_bytes = total_bytes
        self._kept: TenantLru[Kept] = TenantLru(total_bytes, tenant_of_key, size=lambda kept: kept[3])

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def bytes_kept(self) -> int:
        return self._kept.total

    def held(self, tenant: str) -> int:
        """The bytes one tenant's sessions hold ("" without auth)."""
        return self._kept.held(tenant)

    def _live(self, key: str) -> Kept | None:
        kept = self._kept.peek(key)
        if kept is not None and self._clock() - kept[0] > self._ttl_s:
            self._kept.pop(key)
            return None
        return kept

    def get(self, key: str) -> Stored:
        if self._live(key) is None:
            return [], None
        _, messages, label, _ = self._kept.get(key)  # type: ignore[misc]
        return list(messages), dict(label)

    def put(self, key: str, messages: Messages, label: Mapping[str, Any]) -> None:
        """The session's messages, their label joined with the stored one."""
        size = len(json.dumps(messages, separators=(",", ":"), ensure_ascii=False, default=str).encode())
        tenant = tenant_of_key(key) or None
        joined = from_json(label, tenant)
        if (before := self._live(key)) is not None:
            joined = from_json(before[2], tenant).join(joined)
        self._kept.pop(key)
        if size > self._total_bytes:
            return
        self._kept.put(key, (self._clock(), list(messages), joined.to_json(), size))


GetHistory = Callable[[str], Awaitable[Stored]]
PutHistory = Callable[[str, Messages, Mapping[str, Any]], Awaitable[None]]


def local_history(store: HistoryStore) -> tuple[GetHistory, PutHistory]:
    async def get(key: str) -> Stored:
        return store.get(key)

    async def put(key: str, messages: Messages, label: Mapping[str, Any]) -> None:
        store.put(key, messages, label)

    return get, put


class HistoryClient:
    def __init__(self, get: GetHistory, put: PutHistory, *, timeout_s: float = 1.0) -> None:
        self._get = get
        self._put = put
        self._timeout_s = timeout_s
        self.failures = 0

    async def read(self, key: str) -> Stored | None:
        """The stored messages and their label (([], None) for a new session); None when the store did
        not answer."""
        try:
            return await asyncio.wait_for(self._get(key), self._timeout_s)
        except Exception as exc:  # noqa: BLE001 -- the store being away costs the history, not the turn
            self.failures += 1
            log.warning("session history unavailable: %s", type(exc).__name__)
            return None

    async def write(self, key: str, messages: Messages, label: Mapping[str, Any]) -> bool:
        try:
            await asyncio.wait_for(self._put(key, messages, label), self._timeout_s)
        except Exception as exc:  # noqa: BLE001 -- see read
            self.failures += 1
            log.warning("session history not stored: %s", type(exc).__name__)
            return False
        return True
