"""`Idempotency-Key` at the HTTP edge: a repeated request returns the stored answer, on any replica.

A client that lost a response (a timeout, a dropped connection) can send the same request with
the same key within `resilience.idempotency.ttl_s` and get the first answer back — marked
`x-spillover-idempotent-replay: true` — instead of running (and paying for) it again. The answers
live in the shared store (router/request/idempotency.py over serve_apps/state/store.py), so the
repeat may reach any gateway replica. A non-streamed repeat that arrives while the first is still
running waits for it (up to `resilience.idempotency.wait_s`). Only successful answers are kept, so
a failed request may be retried with its key. Keys are scoped by tenant; the same key with a
different body, or with other contract headers (an L3 answer is never replayed to an L1 or
`local_only` repeat), is 400 `idempotency_key_reused`.

Streams: the SSE events the client got are kept as they are sent and stored once the stream has
ended well (`data: [DONE]` reached, no error event, within the byte bound); a repeat after that gets
them again as a stream, with the replay header. A repeat while the first stream is still running is
`409 idempotency_in_progress` (it does not wait: its client is already waiting for a first byte). A
stream that fails, or whose client goes away, stores nothing: its marker is deleted.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from router import headers as hdr
from router.errors import InvalidRequest
from router.request.idempotency import Fresh, IdempotencyStore, StoredResponse, fingerprint, validate_key
from router.request.openai_request import decode_json

KEY_HEADER = hdr.IDEMPOTENCY_KEY
REPLAY_HEADER = hdr.IDEMPOTENT_REPLAY
_KEPT_HEADER_PREFIX = hdr.SPILLOVER_PREFIX
_DONE = "data: [DONE]"


def _failed(chunk: str) -> bool:
    """Whether an SSE chunk carries an error event (serve_apps/http/surface.py `_guard_stream`, an engine's)."""
    if '"error"' not in chunk:
        return False
    for line in chunk.splitlines():
        if line.startswith("data:") and '"error"' in line:
            try:
                event = json.loads(line[5:])
            except ValueError:
                continue
            if isinstance(event, dict) and "error" in event:
                return True
    return False


class IdempotentReplies:
    def __init__(self, store: IdempotencyStore, *, wait_s: float) -> None:
        self._store = store
        self._wait_s = wait_s
        self._cleanups: set[asyncio.Task[None]] = set()  # abandons begun while a stream was cancelled

    async def answer(
        self,
        key: str,
        tenant: str,
        raw: bytes,
        produce: Callable[[], Awaitable[Response]],
        headers: Mapping[str, str] | None = None,
    ) -> tuple[Response, bool]:
        """The response for a request carrying `key`, and whether it was replayed. Raises
        `InvalidRequest` for a bad or reused key, `IdempotencyConflict` for a twin still running."""
        validate_key(key)
        try:
            body = decode_json(raw)  # bounded like the request's own parse: never a RecursionError
        except InvalidRequest:
            return await produce(), False  # the request itself will be answered 400
        if not isinstance(body, dict):
            return await produce(), False
        stream = body.get("stream") is True
        begun = await self._store.begin(tenant, key, fingerprint(body, headers), wait_s=self._wait_s, stream=stream)
        if not isinstance(begun, Fresh):
            return _replay(begun.stored), True
        marker = begun.marker
        try:
            response = await produce()
        except BaseException:
            self._later(self._store.abandon(tenant, key, marker))
            raise
        kept = {k: v for k, v in response.headers.items() if k.lower().startswith(_KEPT_HEADER_PREFIX)}
        ok = 200 <= response.status_code < 300
        if isinstance(response, StreamingResponse) and ok:
            response.body_iterator = self._kept(response.body_iterator, tenant, key, marker, response.status_code, kept)
        elif isinstance(response, JSONResponse) and ok:
            stored = StoredResponse(response.status_code, json.loads(bytes(response.body)), kept)
            await self._store.complete(tenant, key, stored, marker)
        else:
            await self._store.abandon(tenant, key, marker)
        return response, False

    async def _kept(
        self,
        chunks: AsyncIterable[str | bytes | memoryview[int]],
        tenant: str,
        key: str,
        marker: bytes,
        status: int,
        headers: dict[str, str],
    ) -> AsyncIterator[str | bytes | memoryview[int]]:
        """The stream as it is sent, each chunk also kept; stored when it ended well, else abandoned."""
        sent: list[str] = []
        size, whole = 0, True
        try:
            async for chunk in chunks:
                text = chunk if isinstance(chunk, str) else bytes(chunk).decode("utf-8", "replace")
                size += len(text.encode("utf-8"))  # the bound is in bytes, as the store counts them
                if whole and (size > self._store.max_bytes or _failed(text)):
                    whole, sent = False, []  # not stored: stop keeping it
                elif whole:
                    sent.append(text)
                yield chunk
        except BaseException:
            self._later(self._store.abandon(tenant, key, marker))  # a cancelled task cannot await it here
            raise
        if whole and any(_DONE in c for c in sent[-2:]):
            await self._store.complete(tenant, key, StoredResponse(status, {}, headers, tuple(sent)), marker)
        else:
            await self._store.abandon(tenant, key, marker)

    def _later(self, step: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(step)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)


def _replay(stored: StoredResponse) -> Response:
    headers = {**stored.headers, REPLAY_HEADER: "true"}
    if stored.chunks is None:
        return JSONResponse(stored.body, stored.status, headers=headers)
    chunks = stored.chunks

    async def again() -> AsyncIterator[str]:
        for chunk in chunks:
            yield chunk

    headers["cache-control"] = "no-cache"
    return StreamingResponse(again(), stored.status, headers=headers, media_type="text/event-stream")
