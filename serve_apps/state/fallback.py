"""Redis while it answers, this replica's own memory while it does not: the store never fails a request.

Every operation goes to the primary store (Redis). The first one that fails (`StoreUnavailable`: refused,
timed out, wrong password) turns the store *down*: that operation and every later one are answered by the
replica's MemoryStore, so a dead Redis costs one request at most `timeout_s`, once, and then nothing. While
down, `run()` pings the primary every `retry_s`; the first answer turns it *up* again and operations go back
to Redis. What was kept in memory meanwhile stays there (it is per replica and short-lived: windows of a
minute, leases of seconds); the shared state in Redis, kept by the server, is what the replicas converge on.
Logs (pooled learning evidence) are not kept while down: each replica learns from its own traffic meanwhile.
Durable sums (the spend ledger) are the exception: those added while down are also kept, and added to Redis
before it counts as up again, so no spend is lost to an outage.

Each change is logged once (not once per request), counted, and shown: `view()` is what /readyz and
`spillover_state_store_up` report.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from router.errors import StoreUnavailable
from serve_apps.state.memory import MemoryStore
from serve_apps.state.store import SharedStore, WindowCount
from serve_apps.state.timing import counted

log = logging.getLogger("spillover.state")

T = TypeVar("T")
MAX_UNSENT = 100_000  # durable sums kept for a store that is down (one per cloud attempt)


@dataclass(frozen=True)
class StoreView:
    kind: str  # the primary's kind ("redis")
    up: bool
    detail: str  # why it is down ("" when up)
    outages: int  # how many times it went down since start


class FallbackStore:
    def __init__(
        self,
        primary: SharedStore,
        local: MemoryStore,
        *,
        retry_s: float = 1.0,
        on_change: Callable[[StoreView], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.primary = primary
        self.local = local
        self.retry_s = retry_s
        self._on_change = on_change
        self._sleep = sleep
        self._clock = clock
        self._up = True
        self._detail = ""
        self._outages = 0
        self._unsent: list[tuple[str, Mapping[str, float]]] = []  # durable sums added while down
        self._changed()  # up until an operation fails: spillover_state_store_up reads 1 from the start

    @property
    def kind(self) -> str:
        return self.primary.kind if self._up else self.local.kind

    def view(self) -> StoreView:
        return StoreView(self.primary.kind, self._up, self._detail, self._outages)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.view())

    def _down(self, exc: StoreUnavailable) -> None:
        if self._up:
            self._up = False
            self._outages += 1
            self._detail = exc.message
            log.warning("shared store down, serving with this replica's own state until it answers: %s", exc.message)
            self._changed()

    async def _use(self, primary: Callable[[], Awaitable[T]], local: Callable[[], Awaitable[T]]) -> T:
        began = self._clock()
        try:
            if self._up:
                try:
                    return await primary()
                except StoreUnavailable as exc:
                    self._down(exc)
            return await local()
        finally:  # the request's Server-Timing (serve_apps/state/timing.py)
            counted(self._clock() - began)

    async def check(self) -> bool:
        """Ping the primary now; True when it answered (and the store is up again)."""
        try:
            await self.primary.ping()
        except StoreUnavailable as exc:
            self._down(exc)
            return False
        if not self._up:
            if not await self._send_unsent():
                return False
            self._up = True
            self._detail = ""
            log.warning("shared store back (%s): shared state resumes", self.primary.kind)
            self._changed()
        return True

    async def _send_unsent(self) -> bool:
        """The durable sums added while down, added to the primary now: nothing booked is lost."""
        while self._unsent:
            key, amounts = self._unsent[0]
            try:
                await self.primary.add_amounts(key, amounts)
            except StoreUnavailable:
                return False
            self._unsent.pop(0)
        return True

    async def run(self) -> None:
        """While down, ping every `retry_s` until the primary answers (a background loop of the replica)."""
        while True:
            await self._sleep(self.retry_s)
            if not self._up:
                await self.check()

    async def get(self, key: str) -> bytes | None:
        return await self._use(lambda: self.primary.get(key), lambda: self.local.get(key))

    async def put(self, key: str, value: bytes, ttl_s: float) -> bool:
        return await self._use(lambda: self.primary.put(key, value, ttl_s), lambda: self.local.put(key, value, ttl_s))

    async def put_if_absent(self, key: str, value: bytes, ttl_s: float) -> bytes | None:
        return await self._use(
            lambda: self.primary.put_if_absent(key, value, ttl_s), lambda: self.local.put_if_absent(key, value, ttl_s)
        )

    async def delete(self, key: str, *, if_value: bytes | None = None) -> bool:
        return await self._use(
            lambda: self.primary.delete(key, if_value=if_value), lambda: self.local.delete(key, if_value=if_value)
        )

    async def window_add(self, key: str, amount: float, limit: float, window_s: float) -> WindowCount:
        return await self._use(
            lambda: self.primary.window_add(key, amount, limit, window_s),
            lambda: self.local.window_add(key, amount, limit, window_s),
        )

    async def window_adjust(self, key: str, window: int, delta: float, window_s: float) -> None:
        await self._use(
            lambda: self.primary.window_adjust(key, window, delta, window_s),
            lambda: self.local.window_adjust(key, window, delta, window_s),
        )

    async def lease_take(self, key: str, holder: str, limit: int, ttl_s: float) -> int | None:
        return await self._use(
            lambda: self.primary.lease_take(key, holder, limit, ttl_s),
            lambda: self.local.lease_take(key, holder, limit, ttl_s),
        )

    async def lease_renew(self, key: str, holders: Sequence[str], ttl_s: float) -> None:
        await self._use(
            lambda: self.primary.lease_renew(key, holders, ttl_s), lambda: self.local.lease_renew(key, holders, ttl_s)
        )

    async def lease_drop(self, key: str, holder: str) -> None:
        # dropped from both: a lease taken while Redis was down lives in memory
        await self.local.lease_drop(key, holder)
        await self._use(lambda: self.primary.lease_drop(key, holder), _nothing)

    async def lease_count(self, key: str) -> int:
        return await self._use(lambda: self.primary.lease_count(key), lambda: self.local.lease_count(key))

    async def lease_holders(self, key: str, limit: int = 256) -> list[str]:
        return await self._use(
            lambda: self.primary.lease_holders(key, limit), lambda: self.local.lease_holders(key, limit)
        )

    async def add_amounts(self, key: str, amounts: Mapping[str, float]) -> None:
        async def unsent() -> None:  # kept to add to the primary when it is back; counted here meanwhile
            if len(self._unsent) >= MAX_UNSENT:
                log.error("shared store down too long: %d durable sums not kept for it", len(self._unsent))
                self._unsent.pop(0)
            self._unsent.append((key, dict(amounts)))
            await self.local.add_amounts(key, amounts)

        await self._use(lambda: self.primary.add_amounts(key, amounts), unsent)

    async def amounts(self, key: str) -> dict[str, float]:
        return await self._use(lambda: self.primary.amounts(key), lambda: self.local.amounts(key))

    async def log_append(self, key: str, values: Sequence[bytes], max_len: int) -> None:
        # a log is for the other replicas: while down nobody else would read it, so nothing is kept for it
        await self._use(lambda: self.primary.log_append(key, values, max_len), _nothing)

    async def log_after(self, key: str, after: str | None, count: int) -> list[tuple[str, bytes]]:
        return await self._use(lambda: self.primary.log_after(key, after, count), _no_entries)

    async def ping(self) -> None:
        await self.check()

    async def close(self) -> None:
        await self.primary.close()


async def _nothing() -> None:
    return None


async def _no_entries() -> list[tuple[str, bytes]]:
    return []
