"""Tickets for deferred requests: a bounded store of answers a client fetches later.

A non-core request deferred under shortage (router/resilience/tiers.py) is answered `202` with a ticket id; the
gateway keeps trying it in the background and stores the outcome here. Bounds: `max_entries`
tickets and `max_bytes` of stored answers (the oldest finished tickets are evicted first; with every
slot pending, a new ticket is refused: the request is shed instead), and a finished ticket is kept
`ttl_s`. A ticket belongs to its tenant: another tenant asking gets the same answer as for an
unknown id.

Each tenant has a share of the store (`tenant_share` of `max_entries` and of `max_bytes`): a tenant
whose tickets fill its share makes room only among its own finished ones (else its new ticket is
refused), a full store evicts the finished tickets of the tenant holding the most first, and an
answer that would take its tenant past its byte share evicts that tenant's own older answers, never
another tenant's. So one tenant's flood of deferred requests cannot shed the others'. Pure: the clock
is injected.
"""

from __future__ import annotations

import json
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

State = Literal["pending", "done", "failed"]


@dataclass(frozen=True)
class Ticket:
    id: str
    owner: str
    model: str
    created_at: float
    state: State = "pending"
    finished_at: float | None = None
    status: int = 202  # the HTTP status of the stored answer once finished
    body: Any = None
    headers: tuple[tuple[str, str], ...] = ()
    size: int = 0


class TicketStore:
    def __init__(
        self,
        *,
        max_entries: int,
        max_bytes: int,
        ttl_s: float,
        clock: Callable[[], float],
        tenant_share: float = 1.0,
    ) -> None:
        if max_entries < 1 or max_bytes < 1 or ttl_s <= 0 or not 0 < tenant_share <= 1:
            raise ValueError("max_entries, max_bytes and ttl_s must be > 0, tenant_share in (0, 1]")
        self._max_entries, self._max_bytes, self._ttl_s = max_entries, max_bytes, ttl_s
        self._share_entries = max(1, int(max_entries * tenant_share))
        self._share_bytes = max(1, int(max_bytes * tenant_share))
        self._clock = clock
        self._tickets: OrderedDict[str, Ticket] = OrderedDict()
        self.bytes_kept = 0
        self.refused_total = 0

    def open(self, ticket_id: str, owner: str, model: str) -> Ticket | None:
        """A new pending ticket; None when every slot holds a pending one, or every slot of the
        owner's share does (the caller sheds)."""
        self._expire()
        while self.held_by(owner) >= self._share_entries:
            if not self._evict_finished(owner=owner):
                self.refused_total += 1
                return None
        while len(self._tickets) >= self._max_entries:
            if not self._evict_finished(owner=self._heaviest()) and not self._evict_finished():
                self.refused_total += 1
                return None
        ticket = Ticket(ticket_id, owner, model, self._clock())
        self._tickets[ticket_id] = ticket
        return ticket

    def held_by(self, owner: str) -> int:
        return sum(t.owner == owner for t in self._tickets.values())

    def finish(self, ticket_id: str, status: int, body: Any, headers: dict[str, str] | None = None) -> Ticket | None:
        ticket = self._tickets.get(ticket_id)
        if ticket is None or ticket.state != "pending":
            return None
        size = len(json.dumps(body, separators=(",", ":"), default=str))
        state: State = "done" if status < 400 else "failed"
        done = replace(
            ticket,
            state=state,
            finished_at=self._clock(),
            status=status,
            body=body,
            headers=tuple(sorted((headers or {}).items())),
            size=size,
        )
        self._tickets[ticket_id] = done
        self.bytes_kept += size
        owner = ticket.owner
        while self._bytes_of(owner) > self._share_bytes and self._evict_finished(keep=ticket_id, owner=owner):
            pass
        while self.bytes_kept > self._max_bytes and (
            self._evict_finished(keep=ticket_id, owner=owner) or self._evict_finished(keep=ticket_id)
        ):
            pass
        if self.bytes_kept > self._max_bytes or self._bytes_of(owner) > self._share_bytes:  # too big to keep
            self._tickets[ticket_id] = replace(done, state="failed", status=507, body=None, size=0, headers=())
            self.bytes_kept -= size
        return self._tickets[ticket_id]

    def get(self, ticket_id: str, owner: str) -> Ticket | None:
        self._expire()
        ticket = self._tickets.get(ticket_id)
        return ticket if ticket is not None and ticket.owner == owner else None

    def pending(self) -> int:
        return sum(t.state == "pending" for t in self._tickets.values())

    def __len__(self) -> int:
        return len(self._tickets)

    def _expire(self) -> None:
        cutoff = self._clock() - self._ttl_s
        for key in [k for k, t in self._tickets.items() if t.finished_at is not None and t.finished_at < cutoff]:
            self.bytes_kept -= self._tickets.pop(key).size

    def _bytes_of(self, owner: str) -> int:
        return sum(t.size for t in self._tickets.values() if t.owner == owner)

    def _heaviest(self) -> str | None:
        """The owner holding the most tickets."""
        counts = Counter(t.owner for t in self._tickets.values())
        return counts.most_common(1)[0][0] if counts else None

    def _evict_finished(self, keep: str | None = None, owner: str | None = None) -> bool:
        """Evict the oldest finished ticket (of `owner` only, when given); False when there is none."""
        for key, ticket in self._tickets.items():
            if ticket.state != "pending" and key != keep and (owner is None or ticket.owner == owner):
                self.bytes_kept -= self._tickets.pop(key).size
                return True
        return False
