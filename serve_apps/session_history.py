"""Server-side session history (`sessions.store: true`): the stored turns of each session.

`HistoryStore` keeps, per pin key (tenant, model alias, session: router/session_id.py), the session's
messages as router/history.py bounds them (`sessions.history_max_bytes` each), at most
`sessions.history_total_bytes` in all (least recently used sessions evicted first), and forgets a
session unused for `sessions.ttl_s`. In a deployment it is a named, detached Ray actor on the head node
next to the pin table (serve_apps/session_actor.py), so every gateway replica reads the same history.

`HistoryClient` is a replica's side: no cache (each turn reads the newest history), and a store that
does not answer within `timeout_s` costs the turn its stored history, never the turn itself (the
record says so).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("spillover.sessions")

Messages = list[Any]


class HistoryStore:
    def __init__(self, clock: Callable[[], float] = time.time, ttl_s: float = 3600, total_bytes: int = 1 << 28) -> None:
        self._clock = clock
        self._ttl_s = ttl_s
        self._total_bytes = total_bytes
        self._kept: OrderedDict[str, tuple[float, Messages, int]] = OrderedDict()
        self.bytes_kept = 0

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: str) -> Messages:
        kept = self._kept.get(key)
        if kept is None:
            return []
        if self._clock() - kept[0] > self._ttl_s:
            self._drop(key)
            return []
        self._kept.move_to_end(key)
        return list(kept[1])

    def put(self, key: str, messages: Messages) -> None:
        size = len(json.dumps(messages, separators=(",", ":"), ensure_ascii=False, default=str).encode())
        self._drop(key)
        if size > self._total_bytes:
            return
        self._kept[key] = (self._clock(), list(messages), size)
        self.bytes_kept += size
        while self.bytes_kept > self._total_bytes:
            self._drop(next(iter(self._kept)))

    def _drop(self, key: str) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self.bytes_kept -= kept[2]


GetHistory = Callable[[str], Awaitable[Messages]]
PutHistory = Callable[[str, Messages], Awaitable[None]]


def local_history(store: HistoryStore) -> tuple[GetHistory, PutHistory]:
    async def get(key: str) -> Messages:
        return store.get(key)

    async def put(key: str, messages: Messages) -> None:
        store.put(key, messages)

    return get, put


class HistoryClient:
    def __init__(self, get: GetHistory, put: PutHistory, *, timeout_s: float = 1.0) -> None:
        self._get = get
        self._put = put
        self._timeout_s = timeout_s
        self.failures = 0

    async def read(self, key: str) -> Messages | None:
        """The stored messages ([] for a new session); None when the store did not answer."""
        try:
            return await asyncio.wait_for(self._get(key), self._timeout_s)
        except Exception as exc:  # noqa: BLE001 -- the store being away costs the history, not the turn
            self.failures += 1
            log.warning("session history unavailable: %s", type(exc).__name__)
            return None

    async def write(self, key: str, messages: Messages) -> bool:
        try:
            await asyncio.wait_for(self._put(key, messages), self._timeout_s)
        except Exception as exc:  # noqa: BLE001 -- see read
            self.failures += 1
            log.warning("session history not stored: %s", type(exc).__name__)
            return False
        return True
