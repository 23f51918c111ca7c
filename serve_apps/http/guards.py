"""What the gateway's HTTP layer refuses or cleans before and after a request runs.

`BodyLimit`      ASGI middleware: a request body may hold at most `max_bytes`. A larger
                 `content-length` is refused at the first read, a body that grows past the limit
                 while it streams in is refused at the chunk that crosses it (`RequestTooLarge`,
                 413), so the gateway never buffers more than the limit. Routes read the body
                 only after they checked the caller's key, so a 401 reads no byte at all. With
                 `timeout_s`, the whole body must arrive that long after the route began, else
                 `RequestBodyTimeout` (408).
`HeadLimit`      ASGI middleware: a request with more header fields or header bytes than
                 `gateway.http_limits` allows is answered 431 before any route runs (the server
                 in front enforces the same limits as the bytes arrive: serve_apps/http/limits.py;
                 this is the gateway's own check, whatever serves it).
`request_id_of`  the client's `x-request-id` when it is 1-128 visible ASCII characters (it goes
                 into response headers and to the engines and providers), else None.
`within`         awaits a request's work for at most `gateway.request_timeout_s`; past it the work is
                 cancelled with the message `request_timeout` (so the dispatcher books the cut attempt
                 as the timeout's, serve_apps/dispatch/record.py) and finishes unwinding before the 504.
`ClientText`     scrubs what an error tells a client: URLs, IP addresses, provider account /
                 organisation / project ids and the words the operator's config names
                 (`client_redactions`: environment variable names, provider hosts) become
                 placeholders. The operator's log keeps the full text.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cluster.config.deployment import SpilloverConfig
from cluster.config.gateway import HttpLimits
from router.errors import HeadersTooLarge, RequestBodyTimeout, RequestError, RequestTimeout, RequestTooLarge

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
    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int = DEFAULT_MAX_BODY_BYTES,
        timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._app = app
        self._max = max_bytes
        self._timeout_s = timeout_s
        self._clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        declared = _declared_length(scope)
        seen = 0
        complete = False
        deadline = None if self._timeout_s is None else self._clock() + self._timeout_s
        too_large = f"the request body is larger than gateway.max_body_bytes = {self._max} bytes"

        async def limited() -> Message:
            nonlocal seen, complete
            if declared is not None and declared > self._max:
                raise RequestTooLarge(too_large)
            if complete or deadline is None:  # after the body, a read waits for the client to leave
                message = await receive()
            else:
                try:  # a timer, not wait_for's task per read
                    async with asyncio.timeout(max(0.0, deadline - self._clock())):
                        message = await receive()
                except TimeoutError:
                    raise RequestBodyTimeout(
                        f"the request body did not arrive within gateway.http_limits.body_timeout_s = "
                        f"{self._timeout_s:g}s"
                    ) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if seen > self._max:
                    raise RequestTooLarge(too_large)
            return message

        await self._app(scope, limited, send)


async def within(work: Awaitable[T], timeout_s: float) -> T:
    """`work`'s result, or TimeoutError after `timeout_s`, once `work` (cancelled with the message
    `request_timeout`) has unwound: its records, quota and spend are booked before the 504 leaves.

    `work` runs in the calling task (no task of its own: this wraps every request twice). At the deadline that
    task is cancelled with the message; the cancellation unwinds `work` and becomes TimeoutError here, taken
    back as `asyncio.timeout` takes its own back. A cancellation of the request itself (its client left)
    passes through as it is."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("within() runs in a task")
    cancelling = task.cancelling()
    fired = False

    def cut() -> None:
        nonlocal fired
        fired = True
        task.cancel(RequestTimeout.code)

    deadline = asyncio.get_running_loop().call_later(timeout_s, cut)
    try:
        result = await work
    except BaseException:
        if not fired:
            raise
        if task.uncancel() > cancelling:
            raise  # the request was cancelled as well: that one goes on
        raise TimeoutError from None  # however the work ended, the cut ended it
    finally:
        deadline.cancel()
    if fired:  # the work swallowed the cut and returned: still past the deadline
        task.uncancel()
        raise TimeoutError
    return result


PROXY_HEADERS = 4  # fields a proxy in front adds to what a client sent (Serve's adds x-request-id)


class HeadLimit:
    def __init__(self, app: ASGIApp, limits: HttpLimits) -> None:
        self._app = app
        self._limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (refused := self._refusal(scope)) is not None:
            body = json.dumps(refused.to_openai()).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": refused.status_code, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self._app(scope, receive, send)

    def _refusal(self, scope: Scope) -> RequestError | None:
        headers = scope.get("headers", ())
        limits = self._limits
        if len(headers) > limits.max_headers + PROXY_HEADERS:
            return HeadersTooLarge(
                f"the request has more than gateway.http_limits.max_headers = {limits.max_headers} header fields"
            )
        size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        size += sum(len(name) + len(value) + 4 for name, value in headers)
        if size > limits.max_header_bytes:
            return HeadersTooLarge(
                f"the request's headers are larger than gateway.http_limits.max_header_bytes = "
                f"{limits.max_header_bytes}"
            )
        return None


def request_guards(max_body_bytes: int, http_limits: HttpLimits | None) -> list[Middleware]:
    """The gateway app's middleware: `HeadLimit` (with `http_limits`), then `BodyLimit`."""
    timeout_s = http_limits.body_timeout_s if http_limits is not None else None
    head = [Middleware(HeadLimit, limits=http_limits)] if http_limits is not None else []
    return [*head, Middleware(BodyLimit, max_bytes=max_body_bytes, timeout_s=timeout_s)]


_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>)]+", re.IGNORECASE)
_IPV4 = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b")
_IPV6_PORT = re.compile(r"\[[0-9a-f:.]*:[0-9a-f:.]*(?:%\w+)?\](?::\d{1,5})?", re.IGNORECASE)  # [fd00::7]:8000
_IPV6 = re.compile(
    r"(?<![\w:])(?:[0-9a-f]{1,4}:){3,7}[0-9a-f]{1,4}\b|(?<![\w:])[0-9a-f]{0,4}::[0-9a-f:]*", re.IGNORECASE
)
# a name with a port and no scheme ("gpu-box-7:8000", "localhost:8265"): a host, whatever the name (it has
# a letter, so "12:30:45" stays)
_HOST_PORT = re.compile(r"(?<![\w.@/-])(?=[a-z0-9.-]*[a-z])[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?:\d{2,5}\b(?!:)", re.I)
# names only a private network resolves, and cloud providers' default machine names ("ip-10-0-1-5")
_PRIVATE_NAME = re.compile(
    r"\b(?:[a-z0-9-]+\.)+(?:internal|local|localdomain|lan|corp|intranet|home\.arpa|svc)\b|\bip-\d{1,3}(?:-\d{1,3}){3}\b",
    re.IGNORECASE,
)
# OpenAI-style organisation / project / user ids, Stripe-style account ids (with a digit, so that
# words like "user-supplied" stay), AWS account numbers
_ACCOUNT = re.compile(r"\b(?:org|proj|user|acct|account)[-_](?=[A-Za-z0-9]*\d)[A-Za-z0-9]{6,}\b|\b\d{12}\b")


_REMEMBERED_CHARS = 512
_REMEMBERED_TEXTS = 1024


class ClientText:
    """Scrubs the strings of an error body (and of a stream's error events) before a client sees it.
    `words` (key variables, provider hosts, this machine's name) are matched as whole names."""

    def __init__(self, words: Iterable[str] = ()) -> None:
        names = sorted({w for w in words if w and len(w) >= 3}, key=len, reverse=True)
        pattern = "|".join(re.escape(w) for w in names)
        self._words = re.compile(f"(?<![\\w.-])(?:{pattern})(?![\\w-])") if names else None
        # every answer's x-spillover-reason is scrubbed, and reasons repeat: short texts are remembered
        self._seen: dict[str, str] = {}

    def text(self, value: str) -> str:
        if len(value) > _REMEMBERED_CHARS:
            return self._scrub(value)
        scrubbed = self._seen.get(value)
        if scrubbed is None:
            if len(self._seen) >= _REMEMBERED_TEXTS:
                self._seen.clear()
            scrubbed = self._seen[value] = self._scrub(value)
        return scrubbed

    def _scrub(self, value: str) -> str:
        if self._words is not None:
            value = self._words.sub("[configured name]", value)
        value = _URL.sub("[url]", value)
        value = _HOST_PORT.sub("[host]", value)
        value = _PRIVATE_NAME.sub("[host]", value)
        value = _IPV4.sub("[host]", value)
        value = _IPV6_PORT.sub("[host]", value)
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

    def events(self, chunk: str) -> str:
        """A stream's chunk with each `data: {"error": ...}` event scrubbed like an error body (an engine's
        error after the first token arrives as such an event); every other event is left as it is."""
        if '"error"' not in chunk:
            return chunk
        lines = chunk.split("\n")
        for index, line in enumerate(lines):
            if not line.startswith("data: {") or '"error"' not in line:
                continue
            try:
                event = json.loads(line[len("data: ") :])
            except ValueError:
                continue
            if isinstance(event, dict) and "error" in event:
                lines[index] = "data: " + json.dumps(self.body(event), separators=(",", ":"))
        return "\n".join(lines)


def client_redactions(config: SpilloverConfig, hostname: str = "") -> list[str]:
    """Names an error text must not show a client: key variables, provider hosts, this machine's name."""
    names = [hostname, *(t.api_key_env for t in config.tenants)]
    for provider in config.cloud.providers:
        names += [provider.api_key_env or "", urlsplit(provider.base_url).hostname or ""]
    return [n for n in names if n]
