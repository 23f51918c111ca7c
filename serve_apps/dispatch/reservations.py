"""Local admission counted where every gateway replica sees it: one lease per admitted request in the
shared store (serve_apps/state/), so however many gateways admit to a model, together they never pass its limit.

A request the plan sends to a local model takes a lease on `admission:<model>` (one store operation, with the
limit the plan used): granted, it runs; refused — other gateways filled the model since this one last read the
count — the count is read as full and the request is planned again (it bursts, or waits in the room). The lease
is held until the request is done: its dispatch has returned and any local stream it started is consumed; each
holder is one reference, the last one drops the lease. A lease lives `admission.lease_ttl_s` and this replica
renews all of its own together every third of that, so the leases of a gateway that died expire within the TTL.

`inflight(model)` is what the plan reads on the request path with no round trip: the count the last store
operation answered (a take answers it, a refresh reads it every `refresh_s`), adjusted at once by this replica's
own takes and drops. With one replica on the in-process store it is exact; with several it may lag the others
by `refresh_s`, which costs at most a refused take, never an admission past the limit.

A local call that no admission preceded (the last fall-back of a route planned for the cloud) is counted with a
lease of its own, without a limit.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from serve_apps.state.store import SharedStore
from serve_apps.state.timing import off_path

log = logging.getLogger("spillover.admission")

UNLIMITED = 1 << 30


def lease_key(model: str) -> str:
    return f"admission:{model}"


@dataclass
class Reservation:
    """One admitted request's lease; `holds` references keep it (the dispatch, each local stream)."""

    model: str
    holder: str
    holds: int = 1
    done: bool = field(default=False)


class Reservations:
    def __init__(
        self,
        store: SharedStore,
        replica: str,
        *,
        ttl_s: float = 10.0,
        refresh_s: float = 0.2,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._store = store
        self._replica = replica
        self._ttl_s = ttl_s
        self._refresh_s = refresh_s
        self._sleep = sleep
        self._seq = itertools.count()
        self._count: dict[str, int] = {}  # model -> the last known count of leases, cluster-wide
        self._held: dict[str, Reservation] = {}  # request id -> its reservation, while its dispatch runs
        self._active: dict[str, Reservation] = {}  # holder -> every lease of this replica not yet given back
        self._pending: set[asyncio.Task[None]] = set()  # drops in flight (never awaited by a request)

    def inflight(self, model: str) -> int:
        return self._count.get(model, 0)

    def holder_of(self, request_id: str) -> str | None:
        """The lease `request_id`'s dispatch holds (None: none)."""
        reservation = self._held.get(request_id)
        return None if reservation is None else reservation.holder

    def live(self, holder: str) -> bool:
        """Whether that lease is still held (a local stream keeps it until consumed)."""
        return holder in self._active

    def _new(self, model: str) -> Reservation:
        reservation = Reservation(model, f"{self._replica}:{next(self._seq)}")
        self._active[reservation.holder] = reservation
        return reservation

    async def reserve(self, model: str, request_id: str, limit: int | None) -> bool:
        """A lease for `request_id` on `model` within `limit` (None: no limit); False when the model is full."""
        if request_id in self._held:
            return True
        if self._pending:  # this replica's own drops first: a slot it gave back is free for it at once
            await asyncio.gather(*self._pending, return_exceptions=True)
        reservation = self._new(model)
        held = await self._store.lease_take(lease_key(model), reservation.holder, limit or UNLIMITED, self._ttl_s)
        if held is None:
            del self._active[reservation.holder]
            self._count[model] = max(self._count.get(model, 0), limit or 0)  # full, as far as anyone knows
            return False
        self._count[model] = held
        self._held[request_id] = reservation
        return True

    async def counted(self, model: str, request_id: str) -> Reservation:
        """The reservation a local call of `request_id` runs under (one more hold for a stream); a call that no
        admission preceded gets a lease of its own, without a limit."""
        reservation = self._held.get(request_id)
        if reservation is None or reservation.model != model:
            reservation = self._new(model)
            held = await self._store.lease_take(lease_key(model), reservation.holder, UNLIMITED, self._ttl_s)
            self._count[model] = held if held is not None else self._count.get(model, 0) + 1
            return reservation  # one hold: the call's own
        reservation.holds += 1
        return reservation

    def release(self, reservation: Reservation) -> None:
        """Give back one hold; the last drops the lease (off the caller's path: it never waits on the store)."""
        reservation.holds -= 1
        if reservation.holds > 0 or reservation.done:
            return
        reservation.done = True
        self._active.pop(reservation.holder, None)
        self._count[reservation.model] = max(0, self._count.get(reservation.model, 0) - 1)
        task = asyncio.get_running_loop().create_task(self._drop(reservation), context=off_path())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def finish(self, request_id: str) -> None:
        """The dispatch of `request_id` has returned: its own hold goes (a local stream may keep the lease)."""
        reservation = self._held.pop(request_id, None)
        if reservation is not None:
            self.release(reservation)

    async def _drop(self, reservation: Reservation) -> None:
        try:
            await self._store.lease_drop(lease_key(reservation.model), reservation.holder)
        except Exception:  # the lease expires on its own: a drop must never fail a request
            log.exception("admission lease of %s not dropped (it expires within its TTL)", reservation.model)

    async def until_done(self, reservation: Reservation, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            self.release(reservation)

    def _live(self) -> dict[str, list[str]]:
        """model -> holders of this replica's live leases."""
        live: dict[str, list[str]] = {}
        for reservation in self._active.values():
            live.setdefault(reservation.model, []).append(reservation.holder)
        return live

    async def run(self, models: Callable[[], list[str]]) -> None:
        """Renew this replica's leases every third of their TTL and refresh the counts every `refresh_s`."""
        renew_every = max(1, round(self._ttl_s / 3 / self._refresh_s))
        for tick in itertools.count():
            await self._sleep(self._refresh_s)
            try:
                if tick % renew_every == 0:
                    for model, holders in self._live().items():
                        await self._store.lease_renew(lease_key(model), holders, self._ttl_s)
                for model in models():
                    self._count[model] = await self._store.lease_count(lease_key(model))
            except Exception:  # the store's fallback answers while Redis is down: anything here is a bug
                log.exception("admission leases not renewed or counted this round")
