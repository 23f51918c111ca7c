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

Shared by every gateway replica through the shared store (serve_apps/state/store.py; with one replica
and no `state.url` the replica's own MemoryStore, the same code path), as set-if-absent:

* the first request with (tenant, key) puts an in-progress *marker* with `put_if_absent` — the
  request's fingerprint and a random owner token — for `marker_ttl_s` (the gateway: its request
  timeout and a margin, the longest a request may run), so a replica that died mid-request never
  blocks its key past that;
* a repeat on any replica polls the store for up to `wait_s` until the marker turns into the answer
  (Replay) or is gone (the first failed: the repeat runs, Fresh); a streamed repeat does not wait:
  `409 idempotency_in_progress`;
* `complete` replaces the marker, while it is still ours, with the answer for `ttl_s`; an answer over
  `max_bytes`, or over the store's own bound per value, is not stored; nor is a failure (status >=
  400): both `abandon`, which deletes the marker only while it is still ours (`delete(if_value=)`).

A request waiting for its in-flight twin holds nothing but a poll of the store: no admission slot,
no engine or provider capacity. TTLs run on the store's clock; waiting runs on the event loop.

    store.begin(...)  -> Fresh   the caller runs the request, then complete(...) or abandon(...)
                      -> Replay  the caller returns `stored` as is (a stream: its `chunks`)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from router import headers as hdr
from router.error_codes import ErrorCode
from router.errors import IdempotencyConflict, InvalidRequest
from router.request.contract_headers import CONTRACT_HEADERS

MAX_KEY_LENGTH = 255


POLL_S = (0.02, 0.5)  # a waiter's first and longest pause between two looks at the store


class Values(Protocol):
    """The part of the shared store (serve_apps/state/store.py `SharedStore`) idempotency uses."""

    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes, ttl_s: float) -> bool: ...

    async def put_if_absent(self, key: str, value: bytes, ttl_s: float) -> bytes | None: ...

    async def delete(self, key: str, *, if_value: bytes | None = None) -> bool: ...


@dataclass(frozen=True)
class StoredResponse:
    """A completed answer: a JSON `body`, or for a stream the SSE `chunks` the client got (body empty)."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    chunks: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Fresh:
    """Nobody ran this request yet: run it, then `complete` or `abandon` the key with `marker` (the
    in-progress value this request put: only it replaces or deletes it)."""

    marker: bytes = b""


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


def _encode(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _stored(record: Mapping[str, Any]) -> StoredResponse:
    answer = record["answer"]
    chunks = answer.get("chunks")
    return StoredResponse(
        int(answer["status"]),
        dict(answer.get("body") or {}),
        {str(k): str(v) for k, v in answer.get("headers", {}).items()},
        None if chunks is None else tuple(str(c) for c in chunks),
    )


class IdempotencyStore:
    """Per (tenant, key) in the shared store `values`: the marker of the request in flight, or its answer."""

    def __init__(
        self,
        values: Values,
        *,
        ttl_s: float = 600.0,
        max_bytes: int = 64 * 1024 * 1024,
        poll_s: float | None = None,
        marker_ttl_s: float | None = None,
    ) -> None:
        if ttl_s <= 0 or max_bytes < 1 or (marker_ttl_s is not None and marker_ttl_s <= 0):
            raise ValueError(
                f"ttl_s, marker_ttl_s must be > 0, max_bytes >= 1, got {ttl_s}, {marker_ttl_s}, {max_bytes}"
            )
        self.values = values
        self.ttl_s = ttl_s
        self.marker_ttl_s = marker_ttl_s or ttl_s
        self.max_bytes = max_bytes
        self._poll = POLL_S if poll_s is None else (poll_s, poll_s)

    @staticmethod
    def _key(tenant: str, key: str) -> str:
        return f"idem:{len(tenant)}:{tenant}:{key}"  # the length keeps tenant "a:b" + key "c" apart from "a" + "b:c"

    async def begin(
        self, tenant: str, key: str, fingerprint: str, *, wait_s: float = 30.0, stream: bool = False
    ) -> Begin:
        """Fresh, or Replay of a completed answer; waits up to `wait_s` for an in-flight twin.

        Raises InvalidRequest: an invalid key (`invalid_idempotency_key`), the key used with
        another body (`idempotency_key_reused`); IdempotencyConflict (409): the twin still running
        after `wait_s` (`idempotency_key_in_use`; the client may retry later), or at once for a
        `stream` (`idempotency_in_progress`: a stream does not wait for another one).
        """
        validate_key(key)
        k = self._key(tenant, key)
        marker = _encode({"fp": fingerprint, "owner": secrets.token_hex(16)})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        pause = self._poll[0]
        while True:
            held = await self.values.put_if_absent(k, marker, self.marker_ttl_s)
            if held is None:
                return Fresh(marker)
            record = json.loads(held)
            if record.get("fp") != fingerprint:
                raise InvalidRequest(
                    "this Idempotency-Key was already used with a different request body or other contract "
                    "headers (x-business-scenario, x-spillover-*); send a new key for a new request",
                    code=ErrorCode.IDEMPOTENCY_KEY_REUSED,
                )
            if "answer" in record:
                return Replay(_stored(record))
            if stream:
                raise IdempotencyConflict(
                    "a request with this Idempotency-Key is still running; retry once it has finished",
                    code=ErrorCode.IDEMPOTENCY_IN_PROGRESS,
                )
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise IdempotencyConflict(
                    f"a request with this Idempotency-Key is still running after {wait_s:g}s; retry later"
                )
            await asyncio.sleep(min(pause, remaining))  # then: completed → Replay, abandoned or expired → Fresh
            pause = min(pause * 2, self._poll[1])

    async def complete(self, tenant: str, key: str, stored: StoredResponse, marker: bytes) -> bool:
        """Store the answer in place of our marker; True when stored.

        A failure (status >= 400) is not stored: it behaves as `abandon`, so the client may retry
        with the same key; so does an answer larger than `max_bytes` or than the store's bound per
        value. When the marker is no longer ours (it expired, another request took the key) the
        answer is dropped.
        """
        answer: dict[str, Any] = {"status": stored.status, "headers": stored.headers}
        if stored.chunks is not None:
            answer["chunks"] = list(stored.chunks)
        else:
            answer["body"] = stored.body
        value = _encode({"fp": json.loads(marker)["fp"], "answer": answer})
        k = self._key(tenant, key)
        if stored.status >= 400 or len(value) > self.max_bytes:
            await self.abandon(tenant, key, marker)
            return False
        if await self.values.get(k) != marker:
            return False
        if await self.values.put(k, value, self.ttl_s):
            return True
        await self.abandon(tenant, key, marker)  # over the store's bound per value
        return False

    async def abandon(self, tenant: str, key: str, marker: bytes) -> None:
        """Forget the in-flight request (it failed) while the marker is still ours: the next one runs fresh."""
        await self.values.delete(self._key(tenant, key), if_value=marker)
