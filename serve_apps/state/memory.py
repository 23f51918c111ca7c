"""The in-process shared store: the embedded default with one gateway replica and no `state.url`.

The same operations as the Redis store (serve_apps/state/redis_store.py), with the same rules, so the
pieces of state built on it behave the same with one replica as with many: TTLs and windows run on the
injected clock, a value over `max_value_bytes` is not stored, and past `max_bytes` of values the ones
closest to expiry go first — Redis's `volatile-ttl` policy, the one `spillover serve` and ray-cluster.yaml
start Redis with. Durable sums (`add_amounts`) have no TTL and are never evicted.

One event loop owns it: every operation runs to its end without awaiting anything, so each is atomic.
It is also the fallback store's per-replica home while Redis cannot be reached (serve_apps/state/fallback.py).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from serve_apps.state.store import DEFAULT_MAX_VALUE_BYTES, WindowCount


@dataclass
class _Value:
    data: bytes
    expires_at: float


class MemoryStore:
    kind = "memory"

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        max_bytes: int = 256 * 1024 * 1024,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        if max_bytes < 1 or max_value_bytes < 1:
            raise ValueError(f"max_bytes and max_value_bytes must be >= 1, got {max_bytes}, {max_value_bytes}")
        self._clock = clock
        self.max_bytes = max_bytes
        self.max_value_bytes = max_value_bytes
        self.bytes_kept = 0
        self._values: dict[str, _Value] = {}
        self._expiry: list[tuple[float, str]] = []  # (expires_at, key), stale entries skipped when popped
        self._windows: dict[str, dict[int, float]] = {}  # key -> window -> count (this one and the last)
        self._leases: dict[str, dict[str, float]] = {}  # key -> holder -> expires_at
        self._amounts: dict[str, dict[str, float]] = {}
        self._logs: dict[str, deque[tuple[int, bytes]]] = {}
        self._log_seq = 0  # one sequence for every log: ids grow with each append, as a stream's do

    # values -----------------------------------------------------------------------------------------

    def _drop(self, key: str) -> None:
        value = self._values.pop(key, None)
        if value is not None:
            self.bytes_kept -= len(value.data)

    def _sweep(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            expires_at, key = heapq.heappop(self._expiry)
            value = self._values.get(key)
            if value is not None and value.expires_at == expires_at:
                self._drop(key)
        while self.bytes_kept > self.max_bytes and self._expiry:  # volatile-ttl: the soonest to expire first
            expires_at, key = heapq.heappop(self._expiry)
            value = self._values.get(key)
            if value is not None and value.expires_at == expires_at:
                self._drop(key)

    def _live(self, key: str) -> _Value | None:
        now = self._clock()
        self._sweep(now)
        value = self._values.get(key)
        return value if value is not None and value.expires_at > now else None

    async def get(self, key: str) -> bytes | None:
        value = self._live(key)
        return None if value is None else value.data

    def _set(self, key: str, data: bytes, ttl_s: float) -> bool:
        if len(data) > self.max_value_bytes:
            return False
        self._drop(key)
        expires_at = self._clock() + max(ttl_s, 0.001)
        self._values[key] = _Value(bytes(data), expires_at)
        self.bytes_kept += len(data)
        heapq.heappush(self._expiry, (expires_at, key))
        self._sweep(self._clock())
        return True

    async def put(self, key: str, value: bytes, ttl_s: float) -> bool:
        return self._set(key, value, ttl_s)

    async def put_if_absent(self, key: str, value: bytes, ttl_s: float) -> bytes | None:
        if len(value) > self.max_value_bytes:
            raise ValueError(f"a value of {len(value)} bytes is over the store's {self.max_value_bytes}")
        held = self._live(key)
        if held is not None:
            return held.data
        self._set(key, value, ttl_s)
        return None

    async def delete(self, key: str, *, if_value: bytes | None = None) -> bool:
        held = self._live(key)
        if held is None or (if_value is not None and held.data != if_value):
            return False
        self._drop(key)
        return True

    # windows ----------------------------------------------------------------------------------------

    async def window_add(self, key: str, amount: float, limit: float, window_s: float) -> WindowCount:
        now = self._clock()
        window = math.floor(now / window_s)
        counts = {w: c for w, c in self._windows.get(key, {}).items() if w >= window - 1}
        self._windows[key] = counts
        used = counts.get(window, 0.0)
        if used + amount > limit:
            return WindowCount(False, used, window, retry_in_s=(window + 1) * window_s - now)
        counts[window] = used + amount
        return WindowCount(True, used + amount, window)

    async def window_adjust(self, key: str, window: int, delta: float, window_s: float) -> None:
        counts = self._windows.get(key, {})
        if window in counts:
            counts[window] = max(0.0, counts[window] + delta)

    # leases -----------------------------------------------------------------------------------------

    def _held(self, key: str) -> dict[str, float]:
        now = self._clock()
        held = {holder: until for holder, until in self._leases.get(key, {}).items() if until > now}
        if held:
            self._leases[key] = held
        else:
            self._leases.pop(key, None)
        return held

    async def lease_take(self, key: str, holder: str, limit: int, ttl_s: float) -> int | None:
        held = self._held(key)
        if holder not in held and len(held) >= limit:
            return None
        held[holder] = self._clock() + ttl_s
        self._leases[key] = held
        return len(held)

    async def lease_renew(self, key: str, holders: Sequence[str], ttl_s: float) -> None:
        held = self._held(key)
        until = self._clock() + ttl_s
        for holder in holders:
            if holder in held:
                held[holder] = until

    async def lease_drop(self, key: str, holder: str) -> None:
        held = self._held(key)
        held.pop(holder, None)
        if not held:
            self._leases.pop(key, None)

    async def lease_count(self, key: str) -> int:
        return len(self._held(key))

    async def lease_holders(self, key: str, limit: int = 256) -> list[str]:
        return sorted(self._held(key))[:limit]

    # durable sums -----------------------------------------------------------------------------------

    async def add_amounts(self, key: str, amounts: Mapping[str, float]) -> None:
        sums = self._amounts.setdefault(key, {})
        for name, amount in amounts.items():
            sums[name] = sums.get(name, 0.0) + amount

    async def amounts(self, key: str) -> dict[str, float]:
        return dict(self._amounts.get(key, {}))

    # logs -------------------------------------------------------------------------------------------

    async def log_append(self, key: str, values: Sequence[bytes], max_len: int) -> None:
        log = self._logs.setdefault(key, deque())
        for value in values:
            if len(value) > self.max_value_bytes:
                continue
            self._log_seq += 1
            log.append((self._log_seq, bytes(value)))
        while len(log) > max(1, max_len):
            log.popleft()

    async def log_after(self, key: str, after: str | None, count: int) -> list[tuple[str, bytes]]:
        start = _log_seq_of(after)
        found = [(f"0-{n}", v) for n, v in self._logs.get(key, ()) if n > start]
        return found[: max(0, count)]

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None


def _log_seq_of(entry: str | None) -> int:
    """The sequence number in an id this store gave ("0-<n>"); -1 (from the oldest) for None or any other."""
    if entry is None:
        return -1
    head, _, seq = entry.partition("-")
    return int(seq) if head == "0" and seq.isdigit() else -1
