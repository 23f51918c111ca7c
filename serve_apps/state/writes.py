"""Writes to the shared store that never hold up, nor fail, the request that makes them.

A finished decision record or ticket is written to the shared store (serve_apps/state/store.py) so that
every gateway replica can answer for it, but the request that made it must not wait for Redis, nor fail
when Redis does not answer. `BackgroundWrites.put` starts the write as a task on the running loop and
returns at once; a write that fails (`StoreUnavailable`, or anything else) is logged and counted in
`failed`, a value larger than the store's `max_value_bytes` is not sent (`oversize`: the caller keeps it
locally only), and past `max_pending` writes in flight a new one is dropped (`dropped`) rather than
pile up behind a slow store. `after`: a write of the same key that must land first (a ticket's pending
state before its answer), awaited before this one is sent. The write runs off the request's path, so its time
is not in the request's `Server-Timing: store` entry (serve_apps/state/timing.py).
"""

from __future__ import annotations

import asyncio
import logging

from serve_apps.state.store import DEFAULT_MAX_VALUE_BYTES, SharedStore
from serve_apps.state.timing import off_path

log = logging.getLogger("spillover.state")


def value_bound(store: SharedStore) -> int:
    """The largest value `store` keeps (a FallbackStore's is its primary's)."""
    for held in (store, getattr(store, "primary", None)):
        bound = getattr(held, "max_value_bytes", None)
        if isinstance(bound, int):
            return bound
    return DEFAULT_MAX_VALUE_BYTES


class BackgroundWrites:
    def __init__(self, store: SharedStore, *, what: str, max_pending: int = 1000) -> None:
        self.store = store
        self.max_value_bytes = value_bound(store)
        self._what = what  # "decision record", "ticket": what the log lines name
        self._max_pending = max_pending
        self._tasks: set[asyncio.Task[None]] = set()
        self.written = 0
        self.failed = 0
        self.oversize = 0
        self.dropped = 0

    def put(
        self, key: str, value: bytes, ttl_s: float, *, after: asyncio.Task[None] | None = None
    ) -> asyncio.Task[None] | None:
        """Start writing `value`; None when it is not written (too large, too many in flight, no loop)."""
        if len(value) > self.max_value_bytes:
            self.oversize += 1
            return None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the event loop: nothing to write with
            self.dropped += 1
            return None
        if len(self._tasks) >= self._max_pending:
            self.dropped += 1
            log.warning("shared store slow: a %s not written (%d writes in flight)", self._what, len(self._tasks))
            return None
        task = loop.create_task(self._write(key, value, ttl_s, after), context=off_path())  # not the request's time
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _write(self, key: str, value: bytes, ttl_s: float, after: asyncio.Task[None] | None) -> None:
        if after is not None:
            await asyncio.gather(after, return_exceptions=True)
        try:
            stored = await self.store.put(key, value, ttl_s)
        except Exception as exc:  # noqa: BLE001 - a store that fails must never fail a request
            self.failed += 1
            log.warning("%s not written to the shared store (%s): %s", self._what, type(exc).__name__, exc)
            return
        if stored:
            self.written += 1
        else:
            self.oversize += 1

    async def drain(self) -> None:
        """Wait for the writes in flight (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


async def read(store: SharedStore, key: str, what: str) -> bytes | None:
    """`store.get(key)`, None when the store fails (logged): a read is never a failed request either."""
    try:
        return await store.get(key)
    except Exception as exc:  # noqa: BLE001
        log.warning("%s not read from the shared store (%s): %s", what, type(exc).__name__, exc)
        return None


def owned_key(prefix: str, owner: str, name: str) -> str:
    """`prefix:len(owner):owner:name`: one owner's key, which no other owner's name can spell."""
    return f"{prefix}:{len(owner)}:{owner}:{name}"
