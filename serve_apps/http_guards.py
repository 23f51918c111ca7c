"""What the gateway's HTTP layer refuses or cleans before and after a request runs.

`BodyLimit`      ASGI middleware: a request body may hold at most `max_bytes`. A larger
                 `content-length` is refused at the first read, a body that grows past the limit
                 while it streams in is refused at the chunk that crosses it (`RequestTooLarge`,
                 413), so the gateway never buffers more than the limit. Routes read the body
                 only after they checked the caller's key, so a 401 reads no byte at all.
`request_id_of`  the client's `x-request-id` when it is 1-128 visible ASCII characters (it goes
                 into response headers and to the engines and providers), else None.
`within`         awaits a request's work for at most `gateway.request_timeout_s`; past it the work is
                 cancelled with the message `request_timeout` (so the dispatcher books the cut attempt
                 as the timeout's, serve_apps/dispatch_record.py) and finishes unwinding before the 504.
`ClientText`     scrubs what an error tells a client: URLs, IP addresses, provider account /
                 organisation / project ids and the words the operator's config names
                 (`client_redactions`: environment variable names, provider hosts) become
                 placeholders. The operator's log keeps the full text.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cluster.config import SpilloverConfig
from router.errors import RequestTimeout, RequestTooLarge

T = TypeVar("T")

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")


def request_id_of(value: str | None) -> str | None:
    return value if value is not None and _REQUEST_ID.fullmatch(value) else None


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() and len(text) <= 20 else None
    return None


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self._app = app
        self._max = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        declared = _declared_length(scope)
        seen = 0
        too_large = f"the request body is larger than gateway.max_body_bytes = {self._max} bytes"

        async def limited() -> Message:
            nonlocal seen
            if declared is not None and declared > self._max:
                raise RequestTooLarge(too_large)
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self._max:
                    raise RequestTooLarge(too_large)
            return message

        await self._app(scope, limited, send)


async def within(work: Awaitable[T], timeout_s: float) -> T:
    """`work`'s result, or TimeoutError after `timeout_s`, once `work` (cancelled with the message
    `request_timeout`) has unwound: its records, quota and spend are booked before the 504 leaves."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except BaseException:  # this request itself was cancelled: so is its work
        task.cancel()
        raise
    if not done:
        task.cancel(RequestTimeout.code)
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise TimeoutError
    return task.result()


_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>)]+", re.IGNORECASE)
_IPV4 = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b")
_IPV6 = re.compile(
    r"(?<![\w:])(?:[0-9a-f]{1,4}:){3,7}[0-9a-f]{1,4}\b|(?<![\w:])[0-9a-f]{0,4}::[0-9a-f:]*", re.IGNORECASE
)
# OpenAI-style organisation / project / user ids, Stripe-style account ids (with a digit, so that
# words like "user-supplied" stay), AWS account numbers
_ACCOUNT = re.compile(r"\b(?:org|proj|user|acct|account)[-_](?=[A-Za-z0-9]*\d)[A-Za-z0-9]{6,}\b|\b\d{12}\b")


class ClientText:
    """Scrubs the strings of an error body before a client sees it."""

    def __init__(self, words: Iterable[str] = ()) -> None:
        names = sorted({w for w in words if w and len(w) >= 3}, key=len, reverse=True)
        self._words = re.compile("|".join(re.escape(w) for w in names)) if names else None

    def text(self, value: str) -> str:
        if self._words is not None:
            value = self._words.sub("[configured name]", value)
        value = _URL.sub("[url]", value)
        value = _IPV4.sub("[host]", value)
        value = _IPV6.sub("[host]", value)
        return _ACCOUNT.sub("[account id]", value)

    def body(self, value: Any) -> Any:
        """`value` with every string in it scrubbed (dicts and lists walked)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.body(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.body(v) for v in value]
        return value


def client_redactions(config: SpilloverConfig) -> list[str]:
    """Names an error text must not show a client: key variables and provider hosts."""
    names = [t.api_key_env for t in config.tenants]
    for provider in config.cloud.providers:
        names += [provider.api_key_env or "", urlsplit(provider.base_url).hostname or ""]
    return [n for n in names if n]
