"""This replica's leases in the shared store: taken per request, renewed in one batch, dropped on release.

A lease is one slot of a limited count every gateway replica shares (serve_apps/state/store.py `lease_take`):
`tenants[].max_concurrent` requests in flight (serve_apps/limits/tenants.py). Each lease has a holder id
unique to the request and a TTL of a few seconds (`ttl_s`). While the request runs this replica keeps it:
one background loop (`run`, started with the gateway's other loops) renews every lease the replica holds
every `renew_s`, one `lease_renew` per key with all its holders — never one task per request. A replica
that dies stops renewing: its leases expire within `ttl_s` and the slots are free again.

`take` is the one store operation on the request's path (after this replica's own drops still in flight, as
serve_apps/dispatch/reservations.py does: a slot it gave back is free for it at once). `drop` is synchronous
for its callers (a slot is released from `finally` blocks and response wrappers): the holder stops being
renewed at once and the `lease_drop` runs as a task of its own right away, off the request's path — the slot
is free as soon as the store hears it, not when the TTL runs out. `flush()` waits for those drops (tests,
shutdown).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable

from router.errors import StoreUnavailable
from serve_apps.state.store import SharedStore
from serve_apps.state.timing import off_path

log = logging.getLogger("spillover.limits")

DEFAULT_TTL_S = 5.0  # a dead replica's slots are free again this soon
DEFAULT_RENEW_S = 1.5  # renewed three times per TTL: one late renewal loses nothing
UNCHECKED = 2**31 - 1  # the limit of a lease taken without a check (`keep`)


class Leases:
    def __init__(
        self,
        store: SharedStore,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        renew_s: float = DEFAULT_RENEW_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        if not 0 < renew_s < ttl_s:
            raise ValueError(f"renew_s must be > 0 and below ttl_s, got {renew_s} and {ttl_s}")
        self.store = store
        self.ttl_s = ttl_s
        self.renew_s = renew_s
        self._sleep = sleep
        self._new_id = new_id
        self._held: dict[str, set[str]] = {}  # key -> holders this replica holds
        self._drops: set[asyncio.Task[None]] = set()

    def held(self, key: str) -> int:
        """How many leases of `key` this replica holds (its own share of the shared count)."""
        return len(self._held.get(key, ()))

    async def take(self, key: str, limit: int) -> str | None:
        """A new lease of `key` unless `limit` are held by all replicas together: its holder id, or None."""
        if self._drops:  # this replica's own drops first: a slot it gave back is free for it at once
            await asyncio.gather(*list(self._drops), return_exceptions=True)
        holder = self._new_id()
        if await self.store.lease_take(key, holder, limit, self.ttl_s) is None:
            return None
        self._held.setdefault(key, set()).add(holder)
        return holder

    def drop(self, key: str, holder: str) -> None:
        holders = self._held.get(key)
        if holders is None or holder not in holders:
            return
        holders.discard(holder)
        if not holders:
            del self._held[key]
        # off the request's path: not in its Server-Timing (serve_apps/state/timing.py)
        task = asyncio.get_running_loop().create_task(self._drop(key, holder), context=off_path())
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)

    async def _drop(self, key: str, holder: str) -> None:
        try:
            await self.store.lease_drop(key, holder)
        except StoreUnavailable as exc:  # a bare store (no fallback): the lease expires within ttl_s
            log.warning("lease %s of %s not dropped (%s): it expires within %gs", holder, key, exc.message, self.ttl_s)
        except Exception:  # a drop must never fail anything: the lease expires on its own
            log.exception("lease %s of %s not dropped: it expires within %gs", holder, key, self.ttl_s)

    async def flush(self) -> None:
        """Wait until every drop asked for so far has reached the store."""
        while self._drops:
            await asyncio.gather(*list(self._drops))

    async def renew(self) -> None:
        """One renewal of every lease this replica holds: one `lease_renew` per key."""
        for key, holders in list(self._held.items()):
            try:
                await self.store.lease_renew(key, sorted(holders), self.ttl_s)
            except StoreUnavailable as exc:
                log.warning("leases of %s not renewed: %s", key, exc.message)

    async def run(self) -> None:
        """Renew every `renew_s` while the replica runs (a background loop of the gateway, started with its
        other loops and ended with the replica: cancelled, it stops; a round that fails does not stop it —
        a loop that died would let every lease of this replica expire under requests still running)."""
        while True:
            await self._sleep(self.renew_s)
            try:
                await self.renew()
            except Exception:  # StoreUnavailable is handled per key: anything here is a bug, logged, not fatal
                log.exception("tenant leases not renewed this round")
