"""`Idempotency-Key` handling: a client retrying a request it is unsure about is not billed twice.

A client that lost the connection cannot tell whether its request ran. With the same
`Idempotency-Key` (scoped by tenant, so tenants cannot read each other's answers) it may send it
again: a completed answer within the TTL is replayed instead of run again; a copy arriving
while the first is still running waits for it rather than running in parallel (the point is to
not pay twice). Failures are not stored, so a failed request may be retried with the same key.
The same key with a different body is a client bug and is refused, as Stripe and OpenAI do; so is
the same key with other contract headers (`x-business-scenario`, `x-spillover-level`, `-residency`,
`-providers`, `-max-cost-usd`, `-deadline-ms`, `-session`): the fingerprint holds them, so an answer
made under a looser contract (an L3 cloud answer) is never replayed to a stricter repeat (L1,
`local_only`).

Per gateway replica and in memory: replays are best effort across replicas and restarts. Memory
is bounded by count (`max_entries`) and by bytes (`max_bytes`, the stored answers' JSON): past
either, the oldest completed answers are evicted, and an answer larger than `max_bytes` on its own
is not stored at all (its key behaves as abandoned). A request waiting for its in-flight twin holds
nothing but a wait on an event: no admission slot, no engine or provider capacity.
The TTL runs on the injected clock; waiting for an in-flight twin runs on the event loop.

    store.begin(...)  -> Fresh   the caller runs the request, then complete(...) or abandon(...)
                      -> Replay  the caller returns `stored` as is
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from router import headers as hdr
from router.error_codes import ErrorCode
from router.errors import IdempotencyConflict, InvalidRequest
from router.request.contract_headers import CONTRACT_HEADERS

MAX_KEY_LENGTH = 255


@dataclass(frozen=True)
class StoredResponse:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Fresh:
    """Nobody ran this request yet: run it, then `complete` or `abandon` the key."""


@dataclass(frozen=True)
class Replay:
    """The request already ran: answer with `stored` (a copy, free to mutate)."""

    stored: StoredResponse


Begin = Fresh | Replay


FINGERPRINT_HEADERS = CONTRACT_HEADERS | {hdr.SESSION}


def fingerprint(body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> str:
    """sha256 of the canonical JSON of a request body (key order and spacing do not matter) together
    with the contract headers given (`FINGERPRINT_HEADERS`, names case-insensitive)."""
    given = {k.lower(): v.strip() for k, v in (headers or {}).items() if k.lower() in FINGERPRINT_HEADERS}
    value = [body, given] if given else body  # without contract headers: the body's own fingerprint
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def validate_key(key: str) -> None:
    """1-255 printable ASCII characters (space to tilde), else InvalidRequest."""
    if not 1 <= len(key) <= MAX_KEY_LENGTH or not all(" " <= ch <= "~" for ch in key):
        raise InvalidRequest(
            f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} printable ASCII characters "
            f"(got {len(key)} characters{'' if key.isascii() else ', some not ASCII'})",
            code=ErrorCode.INVALID_IDEMPOTENCY_KEY,
        )


@dataclass
class _Entry:
    fingerprint: str
    expires_at: float
    done: asyncio.Event = field(default_factory=asyncio.Event)  # set when completed or abandoned
    stored: StoredResponse | None = None
    size: int = 0  # JSON bytes of `stored`, counted in the store's bytes_kept


def _size(stored: StoredResponse) -> int:
    return len(json.dumps(stored.body, separators=(",", ":"))) + sum(len(k) + len(v) for k, v in stored.headers.items())


_Key = tuple[str, str]


class IdempotencyStore:
    """Remembers, per (tenant, key), the request in flight or its completed answer.

    In-flight entries also expire after `ttl_s` (a caller that never completed nor abandoned
    them must not block the key forever). Over `max_entries`, the oldest completed answers are
    evicted; in-flight entries never are (their count is bounded by concurrency).
    """

    def __init__(
        self,
        *,
        ttl_s: float = 600.0,
        max_entries: int = 10_000,
        max_bytes: int = 64 * 1024 * 1024,
        clock: Callable[[], float],
    ) -> None:
        if ttl_s <= 0 or max_entries < 1 or max_bytes < 1:
            raise ValueError(
                f"ttl_s must be > 0, max_entries and max_bytes >= 1, got {ttl_s}, {max_entries}, {max_bytes}"
            )
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes_kept = 0  # JSON bytes of the completed answers held
        self._clock = clock
        # Both in insertion order, and with one TTL also in expiry order: sweeping the front
        # drops every expired entry.
        self._inflight: OrderedDict[_Key, _Entry] = OrderedDict()
        self._completed: OrderedDict[_Key, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._inflight) + len(self._completed)

    def _sweep(self, now: float) -> None:
        for entries in (self._inflight, self._completed):
            while entries:
                key, entry = next(iter(entries.items()))
                if entry.expires_at > now:
                    break
                del entries[key]
                self.bytes_kept -= entry.size
                entry.done.set()  # an expired in-flight twin counts as abandoned: wake its waiters

    def _evict(self) -> None:
        while (len(self) > self.max_entries or self.bytes_kept > self.max_bytes) and self._completed:
            _, entry = self._completed.popitem(last=False)
            self.bytes_kept -= entry.size

    async def begin(self, tenant: str, key: str, fingerprint: str, *, wait_s: float = 30.0) -> Begin:
        """Fresh, or Replay of a completed answer; waits up to `wait_s` for an in-flight twin.

        Raises InvalidRequest: an invalid key (`invalid_idempotency_key`), the key used with
        another body (`idempotency_key_reused`), or the twin still running after `wait_s`
        (`idempotency_key_in_use`; the client may retry later).
        """
        validate_key(key)
        k = (tenant, key)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            self._sweep(self._clock())
            entry = self._completed.get(k) or self._inflight.get(k)
            if entry is None:
                self._inflight[k] = _Entry(fingerprint, self._clock() + self.ttl_s)
                self._evict()
                return Fresh()
            if entry.fingerprint != fingerprint:
                raise InvalidRequest(
                    "this Idempotency-Key was already used with a different request body or other contract "
                    "headers (x-business-scenario, x-spillover-*); send a new key for a new request",
                    code=ErrorCode.IDEMPOTENCY_KEY_REUSED,
                )
            if entry.stored is not None:
                return Replay(copy.deepcopy(entry.stored))
            remaining = deadline - loop.time()
            try:
                async with asyncio.timeout(max(0.0, remaining)):
                    await entry.done.wait()
            except TimeoutError:
                raise IdempotencyConflict(
                    f"a request with this Idempotency-Key is still running after {wait_s:g}s; retry later"
                ) from None
            # Completed → Replay, abandoned → Fresh (or another waiter won and we wait again).

    def complete(self, tenant: str, key: str, stored: StoredResponse, *, size_bytes: int | None = None) -> None:
        """Store the answer of the in-flight request and wake its waiters.

        A failure (status >= 400) is not stored: it behaves as `abandon`, so the client may
        retry with the same key; so does an answer larger than `max_bytes` (`size_bytes`: its
        JSON's length, measured here when not given). Without an in-flight entry (it expired)
        the answer is dropped.
        """
        size = size_bytes if size_bytes is not None else _size(stored)
        if stored.status >= 400 or size > self.max_bytes:
            self.abandon(tenant, key)
            return
        k = (tenant, key)
        entry = self._inflight.pop(k, None)
        if entry is None:
            return
        entry.stored = copy.deepcopy(stored)
        entry.size = size
        self.bytes_kept += size
        entry.expires_at = self._clock() + self.ttl_s
        self._completed[k] = entry
        entry.done.set()
        self._evict()

    def abandon(self, tenant: str, key: str) -> None:
        """Forget the in-flight request (it failed): the next request with the key runs fresh."""
        entry = self._inflight.pop((tenant, key), None)
        if entry is not None:
            entry.done.set()
