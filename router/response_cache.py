"""Read-only answers for when every target is down: a bounded cache of recent answers by request.

With `traffic.cache.enabled`, the gateway keeps the answer of every successful non-streamed chat request,
keyed by the tenant and the request's canonical JSON body (the same model, messages and parameters: an
identical request). While targets answer, the cache is only written; when a request finds no target at
all (the shortage of router/tiers.py), an identical earlier request's answer is served instead of the
error, marked `x-spillover-degraded: cached`. Bounded by `max_entries`, `max_bytes` and `ttl_s` (least
recently used first out). Pure: the clock is injected.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any


def cache_key(tenant: str | None, body: Mapping[str, Any]) -> str | None:
    """None for what is never cached: streams."""
    if body.get("stream"):
        return None
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{tenant or ''}\n{canonical}".encode()).hexdigest()


class ResponseCache:
    def __init__(self, *, max_entries: int, max_bytes: int, ttl_s: float, clock: Callable[[], float]) -> None:
        if max_entries < 1 or max_bytes < 1 or ttl_s <= 0:
            raise ValueError("max_entries, max_bytes and ttl_s must be > 0")
        self._max_entries, self._max_bytes, self._ttl_s = max_entries, max_bytes, ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, int, dict[str, Any]]] = OrderedDict()
        self.bytes_kept = 0
        self.hits = 0

    def put(self, key: str, answer: dict[str, Any]) -> None:
        size = len(json.dumps(answer, separators=(",", ":"), default=str))
        if size > self._max_bytes:
            return
        self._drop(key)
        self._entries[key] = (self._clock(), size, answer)
        self.bytes_kept += size
        while len(self._entries) > self._max_entries or self.bytes_kept > self._max_bytes:
            self._drop(next(iter(self._entries)))

    def get(self, key: str) -> dict[str, Any] | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] < self._clock() - self._ttl_s:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry[2]

    def __len__(self) -> int:
        return len(self._entries)

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes_kept -= entry[1]
