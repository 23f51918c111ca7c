"""A bounded store whose eviction takes from the tenant holding the most, never across a smaller one.

Pure: no clock, no I/O. The session stores (the pin table, the stored history, a replica's kept
summaries) are bounded in all — in entries, or in bytes — and are shared by every tenant. A plain
least-recently-used bound lets one tenant that opens sessions fast evict every other tenant's. Here
each entry belongs to a tenant (its key's, `tenant_of`), and when the store is over its bound the
least recently used entry *of the tenant holding the most* (in the store's own measure) goes first:
a tenant can fill only what the others leave, and never evicts a tenant that holds less than it —
each tenant keeps at least an equal share of the bound while it uses one, and an idle share is
lent to whoever needs it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

V = TypeVar("V")


class TenantLru(Generic[V]):
    def __init__(self, limit: int, tenant_of: Callable[[str], str], size: Callable[[V], int] = lambda _: 1) -> None:
        self._limit = limit
        self._tenant_of = tenant_of
        self._size = size
        self._by_tenant: dict[str, OrderedDict[str, tuple[V, int]]] = {}
        self._held: dict[str, int] = {}  # per tenant, in the store's measure
        self.total = 0

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._by_tenant.values())

    def __iter__(self) -> Iterator[str]:
        for entries in list(self._by_tenant.values()):
            yield from list(entries)

    def held(self, tenant: str) -> int:
        return self._held.get(tenant, 0)

    def peek(self, key: str) -> V | None:
        entries = self._by_tenant.get(self._tenant_of(key))
        kept = entries.get(key) if entries is not None else None
        return kept[0] if kept is not None else None

    def get(self, key: str) -> V | None:
        """The entry, now the most recently used of its tenant."""
        entries = self._by_tenant.get(self._tenant_of(key))
        if entries is None or key not in entries:
            return None
        entries.move_to_end(key)
        return entries[key][0]

    def put(self, key: str, value: V) -> None:
        """Keep `value` under `key` (the most recently used of its tenant), then evict down to the bound."""
        self.pop(key)
        tenant, size = self._tenant_of(key), self._size(value)
        self._by_tenant.setdefault(tenant, OrderedDict())[key] = (value, size)
        self._held[tenant] = self._held.get(tenant, 0) + size
        self.total += size
        while self.total > self._limit and self.total > 0:
            largest = max(self._held, key=self._held.__getitem__)
            self.pop(next(iter(self._by_tenant[largest])))

    def pop(self, key: str) -> V | None:
        tenant = self._tenant_of(key)
        entries = self._by_tenant.get(tenant)
        kept = entries.pop(key, None) if entries is not None else None
        if kept is None:
            return None
        self._held[tenant] -= kept[1]
        self.total -= kept[1]
        if not entries:
            del self._by_tenant[tenant], self._held[tenant]
        return kept[0]

    def clear(self) -> int:
        dropped = len(self)
        self._by_tenant.clear()
        self._held.clear()
        self.total = 0
        return dropped
