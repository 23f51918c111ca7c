"""The shared store's interface: the few atomic operations every cross-replica piece of state is made of.

Gateway replicas share state through one store (docs/architecture.md, "Cross-request state"): a Redis
server under `state.url` (serve_apps/state/redis_store.py), or, with one replica and no `state.url`, the
in-process store (serve_apps/state/memory.py) behind the same interface. Each operation is atomic on its
own: a replica never reads a half-made change of another. Values are bytes the caller encodes; keys are
the caller's, namespaced by the store.

    get / put / put_if_absent / delete   values with a TTL (records, idempotent answers, tickets)
    window_add / window_adjust           fixed-window counters (requests and tokens per minute)
    lease_take / lease_renew / lease_drop / lease_count
                                         slots held by a holder until released or expired (in-flight
                                         counts: a gateway that dies leaves its leases to expire)
    add_amounts / amounts                durable sums with no TTL (the spend ledger's monthly totals)
    log_append / log_after               a bounded log every replica appends to and reads on from where it
                                         was (pooled learning evidence)

A store that cannot be reached raises `StoreUnavailable` (router/errors.py): the fallback store
(serve_apps/state/fallback.py) turns that into per-replica answers, never a failed request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

DEFAULT_MAX_VALUE_BYTES = 1024 * 1024  # one value; larger ones are not stored (`put` answers False)


@dataclass(frozen=True)
class WindowCount:
    """A fixed window's count after `window_add`.

    `window` names the window (its start, in whole `window_s` since the epoch of the store's clock), for a
    later `window_adjust` of the same window. Refused: `used` is the count without this amount, and
    `retry_in_s` the time until the window rolls over.
    """

    allowed: bool
    used: float
    window: int
    retry_in_s: float = 0.0


class SharedStore(Protocol):
    """What every cross-replica piece of state needs of its home (see the module docstring)."""

    @property
    def kind(self) -> str:
        """ "redis" or "memory": what answers (/readyz says)."""
        ...

    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes, ttl_s: float) -> bool:
        """Store `value` for `ttl_s`; False (nothing stored) when it is larger than the store's bound."""
        ...

    async def put_if_absent(self, key: str, value: bytes, ttl_s: float) -> bytes | None:
        """Store `value` unless the key holds one: None when stored, else the value already there."""
        ...

    async def delete(self, key: str, *, if_value: bytes | None = None) -> bool:
        """Remove the key (only while it holds `if_value`, when given); True when something was removed."""
        ...

    async def window_add(self, key: str, amount: float, limit: float, window_s: float) -> WindowCount:
        """Add `amount` to the current window of `key` unless the sum would pass `limit`."""
        ...

    async def window_adjust(self, key: str, window: int, delta: float, window_s: float) -> None:
        """Add `delta` (negative: give back) to window `window` of `key`, if it is still kept."""
        ...

    async def lease_take(self, key: str, holder: str, limit: int, ttl_s: float) -> int | None:
        """A lease for `holder` unless `limit` unexpired leases are held: None when full, else the count
        held with this one. Taking a lease `holder` already holds renews it."""
        ...

    async def lease_renew(self, key: str, holders: Sequence[str], ttl_s: float) -> None:
        """Push the expiry of the leases `holders` still hold to `ttl_s` from now."""
        ...

    async def lease_drop(self, key: str, holder: str) -> None: ...

    async def lease_count(self, key: str) -> int: ...

    async def lease_holders(self, key: str, limit: int = 256) -> list[str]:
        """Up to `limit` holders of unexpired leases on `key` (a directory of who is alive)."""
        ...

    async def add_amounts(self, key: str, amounts: Mapping[str, float]) -> None:
        """Add each amount to its field of `key` (kept with no TTL: durable where the store is)."""
        ...

    async def amounts(self, key: str) -> dict[str, float]: ...

    async def log_append(self, key: str, values: Sequence[bytes], max_len: int) -> None:
        """Append `values` in order to the log `key`, which keeps about its last `max_len` entries (Redis trims
        a stream by whole nodes: a few more may stay). A value over the store's bound is not kept."""
        ...

    async def log_after(self, key: str, after: str | None, count: int) -> list[tuple[str, bytes]]:
        """Up to `count` entries (id, value) of `key` after the entry `after` (None: from the oldest kept), oldest
        first. Ids are the store's own and grow with each append; pass the last one read to read on."""
        ...

    async def ping(self) -> None:
        """Raises StoreUnavailable when the store cannot be reached."""
        ...

    async def close(self) -> None: ...
