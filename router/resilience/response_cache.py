"""Read-only answers for when every target is down: a bounded cache of recent answers by request.

With `traffic.cache.enabled`, the gateway keeps the answer of every successful non-streamed chat request,
keyed by the request's canonical JSON body (the same model, messages, parameters and schemas: an identical
request) together with its tenant, its session and its contract's terms (level, residency, providers,
target patterns, cost ceiling, quality floor: `contract_terms`; the scenario counts through the terms it
fixes). While targets answer, the cache is only written; when a request finds no target at all (the
shortage of router/resilience/tiers.py), an identical earlier request's answer is served instead of the error, marked
`x-spillover-degraded: cached` — and only when the target that made it passes the request's own hard
filters (`could_have_answered`: a cloud answer is never served to a `local_only` request, nor to an L1
request that cloud target could not take). Bounded by `max_entries`, `max_bytes` and `ttl_s` (least
recently used first out). Pure: the clock is injected.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from router.request.contract import RequestContract
from router.routing.capabilities import Target
from router.routing.filters import DEFAULT_FILTERS
from router.routing.plugins import UNKNOWN_STATE


def contract_terms(contract: RequestContract) -> dict[str, Any]:
    """What of the contract, besides the body, decides who may answer and with what context."""
    residency = contract.residency if isinstance(contract.residency, str) else sorted(contract.residency)
    providers = None if contract.allowed_providers is None else sorted(contract.allowed_providers)
    return {
        "tenant": contract.tenant or "",
        "session": contract.session,
        "level": contract.level,
        "residency": residency,
        "providers": providers,
        "targets": list(contract.allowed_target_patterns),
        "max_cost_usd": contract.max_cost_usd,
        "quality_floor": contract.quality_floor,
    }


def cache_key(contract: RequestContract, body: Mapping[str, Any]) -> str | None:
    """None for what is never cached: streams."""
    if body.get("stream"):
        return None
    canonical = json.dumps([contract_terms(contract), body], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def could_have_answered(contract: RequestContract, makers: Sequence[Target]) -> bool:
    """Whether every target that may have made a cached answer (those behind its `x-spillover-target`)
    passes `contract`'s hard filters (router/routing/filters.py): residency, data policy, providers, ..."""
    return bool(makers) and all(
        f.apply(contract, target, UNKNOWN_STATE) is None for target in makers for f in DEFAULT_FILTERS
    )


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
