"""Tickets every gateway replica can answer for, through the shared store.

`SharedTickets` is the gateway's `TicketStore` (router/traffic/tickets.py): the replica that deferred the
request keeps and finishes the ticket as before, and each state it takes is also written to the shared
store (serve_apps/state/store.py) under the ticket's owner and id, off the request path
(serve_apps/state/writes.py): the pending ticket when it opens (kept `max_wait_s + ttl_s`: it finishes
within `traffic.tickets.max_wait_s`), then its answer when it finishes (kept `traffic.tickets.ttl_s`),
written after the pending one. `find(id, owner)` answers from this replica first, then from the shared
store, and only the owner's ticket. A stored error answer is kept as its message, code, type, param and
status, and answered as that error again by the replica that reads it (scrubbed as every error is).
An answer over the store's `max_value_bytes` is kept by the finishing replica only: through another
replica the ticket reads as an answer too large to keep (as a ticket over `max_bytes` does everywhere).
A value that is not such a ticket (not JSON, another owner's or id's, a state, status or header the route
cannot answer with) reads as no ticket: `404 ticket_not_found`, never a 500.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, get_args

from router.errors import RequestError
from router.traffic.tickets import State, Ticket, TicketStore
from serve_apps.state.store import SharedStore
from serve_apps.state.writes import BackgroundWrites, owned_key, read

STATES: tuple[str, ...] = get_args(State)

log = logging.getLogger("spillover.traffic")


def ticket_key(owner: str, ticket_id: str) -> str:
    return owned_key("ticket", owner, ticket_id)


def _error(exc: RequestError) -> dict[str, Any]:
    fields = ("message", "status_code", "error_type", "code", "param", "degraded")
    return {name: getattr(exc, name, None) for name in fields}


def _from_error(data: dict[str, Any]) -> RequestError:
    exc = RequestError.quoting(str(data.get("message") or ""), str(data.get("code") or ""))
    exc.code = data.get("code")
    exc.param = data.get("param")
    exc.status_code = int(data.get("status_code") or 502)
    exc.error_type = str(data.get("error_type") or "api_error")
    exc.degraded = str(data.get("degraded") or "")
    return exc


def encode(ticket: Ticket) -> bytes:
    body = ticket.body
    data: dict[str, Any] = {
        "id": ticket.id,
        "owner": ticket.owner,
        "model": ticket.model,
        "created_at": ticket.created_at,
        "state": ticket.state,
        "finished_at": ticket.finished_at,
        "status": ticket.status,
        "headers": [list(h) for h in ticket.headers],
        "size": ticket.size,
    }
    data |= {"error": _error(body)} if isinstance(body, RequestError) else {"body": body}
    return json.dumps(data, separators=(",", ":"), default=str).encode()


def _header(name: object, value: object) -> tuple[str, str]:
    pair = (str(name), str(value))
    if not all(part.isprintable() and part.isascii() for part in pair) or not pair[0]:
        raise ValueError("a header that cannot be sent")
    return pair


def decode(raw: bytes) -> Ticket:
    """The ticket `encode` wrote; ValueError, KeyError or TypeError for anything else."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise TypeError("not a ticket")
    state, status = data["state"], int(data["status"])
    if state not in STATES or not 100 <= status <= 599:
        raise ValueError(f"state {str(state)[:16]!r}, status {status}")
    body = _from_error(data["error"]) if "error" in data else data.get("body")
    return Ticket(
        id=str(data["id"]),
        owner=str(data["owner"]),
        model=str(data["model"]),
        created_at=float(data["created_at"]),
        state=state,
        finished_at=data.get("finished_at"),
        status=status,
        body=body,
        headers=tuple(_header(k, v) for k, v in data.get("headers") or ()),
        size=int(data.get("size") or 0),
    )


class SharedTickets(TicketStore):
    def __init__(
        self,
        store: SharedStore,
        *,
        max_entries: int,
        max_bytes: int,
        ttl_s: float,
        max_wait_s: float,
        clock: Callable[[], float],
        tenant_share: float = 1.0,
    ) -> None:
        super().__init__(
            max_entries=max_entries, max_bytes=max_bytes, ttl_s=ttl_s, clock=clock, tenant_share=tenant_share
        )
        self.ttl_s = ttl_s
        self.pending_ttl_s = max_wait_s + ttl_s
        self.writes = BackgroundWrites(store, what="ticket")
        self._opened: dict[str, asyncio.Task[None]] = {}  # ticket id -> its pending state's write

    def open(self, ticket_id: str, owner: str, model: str) -> Ticket | None:
        ticket = super().open(ticket_id, owner, model)
        if ticket is not None:
            task = self.writes.put(ticket_key(owner, ticket_id), encode(ticket), self.pending_ttl_s)
            if task is not None:
                self._opened[ticket_id] = task
                task.add_done_callback(lambda _: self._opened.pop(ticket_id, None))
        return ticket

    def finish(self, ticket_id: str, status: int, body: Any, headers: dict[str, str] | None = None) -> Ticket | None:
        done = super().finish(ticket_id, status, body, headers)
        if done is not None:
            after = self._opened.get(ticket_id)  # the answer lands after the pending state, never under it
            value = encode(done)
            if len(value) > self.writes.max_value_bytes:  # the others answer that it was too large to keep
                value = encode(replace(done, state="failed", status=507, body=None, headers=(), size=0))
            self.writes.put(ticket_key(done.owner, ticket_id), value, self.ttl_s, after=after)
        return done

    async def find(self, ticket_id: str, owner: str) -> Ticket | None:
        """`owner`'s ticket `ticket_id`: this replica's, else the shared store's."""
        local = self.get(ticket_id, owner)
        if local is not None:
            return local
        raw = await read(self.writes.store, ticket_key(owner, ticket_id), "ticket")
        if raw is None:
            return None
        try:
            ticket = decode(raw)
        except Exception as exc:  # noqa: BLE001 - whatever the store held, an unreadable ticket is a 404, never a 500
            log.warning("ticket %s in the shared store unreadable (%s)", ticket_id[:128], type(exc).__name__)
            return None
        return ticket if ticket.owner == owner and ticket.id == ticket_id else None


async def find_ticket(store: TicketStore | None, ticket_id: str, owner: str) -> Ticket | None:
    if store is None:
        return None
    if isinstance(store, SharedTickets):
        return await store.find(ticket_id, owner)
    return store.get(ticket_id, owner)
