"""`Idempotency-Key` at the HTTP edge: a repeated non-streamed request returns the stored answer.

A client that lost a response (a timeout, a dropped connection) can send the same request with
the same key within `resilience.idempotency.ttl_s` and get the first answer back — marked
`x-spillover-idempotent-replay: true` — instead of running (and paying for) it again. A repeat
that arrives while the first is still running waits for it. Only successful answers are kept, so
a failed request may be retried with its key. Keys are scoped by tenant; the same key with a
different body, or with other contract headers (an L3 answer is never replayed to an L1 or
`local_only` repeat), is 400 `idempotency_key_reused`. Streams cannot be replayed from a store of
complete answers, so a streamed request with a key is 400 `idempotency_not_supported`.

Keys live in the gateway replica that saw them (see README: several gateway replicas).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping

from starlette.responses import JSONResponse, Response

from router import headers as hdr
from router.error_codes import ErrorCode
from router.errors import InvalidRequest
from router.request.idempotency import Fresh, IdempotencyStore, StoredResponse, fingerprint, validate_key
from router.request.openai_request import decode_json

KEY_HEADER = hdr.IDEMPOTENCY_KEY
REPLAY_HEADER = hdr.IDEMPOTENT_REPLAY
_KEPT_HEADER_PREFIX = hdr.SPILLOVER_PREFIX


class IdempotentReplies:
    def __init__(self, store: IdempotencyStore, *, wait_s: float) -> None:
        self._store = store
        self._wait_s = wait_s

    async def answer(
        self,
        key: str,
        tenant: str,
        raw: bytes,
        produce: Callable[[], Awaitable[Response]],
        headers: Mapping[str, str] | None = None,
    ) -> tuple[Response, bool]:
        """The response for a request carrying `key`, and whether it was replayed. Raises
        `InvalidRequest` for a bad key, a reused key or a stream."""
        validate_key(key)
        try:
            body = decode_json(raw)  # bounded like the request's own parse: never a RecursionError
        except InvalidRequest:
            return await produce(), False  # the request itself will be answered 400
        if not isinstance(body, dict):
            return await produce(), False
        if body.get("stream") is True:
            raise InvalidRequest(
                "Idempotency-Key works with non-streamed requests only (a stream cannot be replayed)",
                param=KEY_HEADER,
                code=ErrorCode.IDEMPOTENCY_NOT_SUPPORTED,
            )
        begun = await self._store.begin(tenant, key, fingerprint(body, headers), wait_s=self._wait_s)
        if not isinstance(begun, Fresh):
            stored = begun.stored
            return JSONResponse(stored.body, stored.status, headers={**stored.headers, REPLAY_HEADER: "true"}), True
        try:
            response = await produce()
        except BaseException:
            self._store.abandon(tenant, key)
            raise
        if isinstance(response, JSONResponse) and 200 <= response.status_code < 300:
            headers = {k: v for k, v in response.headers.items() if k.lower().startswith(_KEPT_HEADER_PREFIX)}
            stored = StoredResponse(response.status_code, json.loads(bytes(response.body)), headers)
            self._store.complete(tenant, key, stored, size_bytes=len(response.body))
        else:
            self._store.abandon(tenant, key)
        return response, False
