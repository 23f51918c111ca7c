"""`gateway.http_limits` where the bytes arrive: the HTTP server in front of the gateway.

uvicorn (Ray Serve's proxy runs it, and so does the cloud simulator) bounds neither the size of a
request's head nor its number of header fields (its httptools parser buffers a 32 MiB header), nor
the time a head or a body may take to arrive (a client sending one byte a second holds a connection
forever), and it starts its keep-alive timer only after a first answer. `LimitedHttpProtocol` is
uvicorn's httptools protocol with those bounds (`HttpLimits`, cluster/config/gateway.py):

* a head (request line and headers) over `max_header_bytes`, or with more than `max_headers` fields:
  431, connection closed. Counted field by field as the parser sees them and, while a head is still
  incomplete, by the bytes received for it: at most one socket read past the limit is ever held.
* a head not complete `header_timeout_s` after the connection opened (on a kept-alive connection:
  after its next byte): 408, closed.
* a body not complete `body_timeout_s` after its head: 408 when no answer has started, and closed
  (the application sees the client gone).
* a kept-alive connection with nothing on it for `idle_timeout_s` (uvicorn's `timeout_keep_alive`):
  closed.

`uvicorn_options(limits)` are the `uvicorn.Config` keywords that serve with it. Ray Serve builds its
proxy's `uvicorn.Config` itself and exposes only `keep_alive_timeout_s` (`http_options`), so
`proxy_callback`, which Serve calls in every proxy process before that process's server starts when
RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH names it, makes the process's uvicorn use this protocol
with the limits in SPILLOVER_HTTP_LIMITS (`proxy_env` sets both; serve_apps/runner.py and
ray-cluster.yaml put them in the environment of the processes Ray starts).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
from collections.abc import Mapping
from typing import Any, ClassVar, cast

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from cluster.config.gateway import HttpLimits
from router.error_codes import ErrorCode
from router.errors import HeadersTooLarge, RequestBodyTimeout, RequestError
from serve_apps.http.coalesce import CoalescedWrites

log = logging.getLogger("spillover.http_limits")

CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
LIMITS_ENV = "SPILLOVER_HTTP_LIMITS"
CALLBACK = "serve_apps.http.limits:proxy_callback"


class _Refused(Exception):
    """Raised in a parser callback: the head passed a limit (httptools turns it into a parser error)."""


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with `limits` enforced on every connection (see the module doc)."""

    limits: ClassVar[HttpLimits] = HttpLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # the bytes arriving now belong to a request head
        self._head_bytes = 0  # received while the head is incomplete (a bound on what the parser holds)
        self._head_lines = 0
        self._fields = 0  # the head's fields and bytes as the parser reports them
        self._field_bytes = 0
        self._refusal: RequestError | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._limits = self.configured_limits()

    @classmethod
    def configured_limits(cls) -> HttpLimits:
        return cls.limits

    # -- uvicorn's protocol hooks ------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # an answer's head and body in one socket write (serve_apps/http/coalesce.py)
        super().connection_made(cast(asyncio.Transport, CoalescedWrites(transport, self.loop)))
        self._arm(self._limits.header_timeout_s, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            if self._timer is None:  # a kept-alive connection's next request begins
                self._arm(self._limits.header_timeout_s, self._head_late)
            self._head_bytes += len(data)
            self._head_lines += data.count(b"\n")
        super().data_received(data)
        if not self._in_head or self._refusal is not None or self.transport.is_closing():
            return
        if self._head_bytes > self._limits.max_header_bytes:
            self._refuse(self._too_large())
        elif self._head_lines > self._limits.max_headers + 1:  # the request line, then one line a field
            self._refuse(self._too_many())

    def on_url(self, url: bytes) -> None:
        self._count(len(url), 0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4, 1)  # "name: value\r\n"
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._in_head = False
        self._head_bytes = self._head_lines = self._fields = self._field_bytes = 0
        self._arm(self._limits.body_timeout_s, self._body_late)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()
        self._in_head = True  # what comes next is the next request's head

    def handle_websocket_upgrade(self) -> None:
        self._disarm()  # the connection is the WebSocket protocol's from here on
        super().handle_websocket_upgrade()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a parser error; a parser error raised by `_count` is our refusal."""
        if self._refusal is None:
            super().send_400_response(msg)
        else:
            self._close_with(self._refusal)

    # -- limits ------------------------------------------------------------------------------

    def _count(self, size: int, fields: int) -> None:
        self._field_bytes += size
        self._fields += fields
        if self._fields > self._limits.max_headers:
            self._refusal = self._too_many()
        elif self._field_bytes > self._limits.max_header_bytes:
            self._refusal = self._too_large()
        if self._refusal is not None:
            raise _Refused(self._refusal.message)

    def _too_large(self) -> RequestError:
        limit = self._limits.max_header_bytes
        return HeadersTooLarge(f"the request's headers are larger than gateway.http_limits.max_header_bytes = {limit}")

    def _too_many(self) -> RequestError:
        return HeadersTooLarge(
            f"the request has more than gateway.http_limits.max_headers = {self._limits.max_headers} header fields"
        )

    def _head_late(self) -> None:
        timeout = self._limits.header_timeout_s
        self._refuse(
            RequestBodyTimeout(
                f"the request's headers did not arrive within gateway.http_limits.header_timeout_s = {timeout:g}s",
                code=ErrorCode.REQUEST_HEADER_TIMEOUT,
            )
        )

    def _body_late(self) -> None:
        timeout = self._limits.body_timeout_s
        self._refuse(
            RequestBodyTimeout(
                f"the request body did not arrive within gateway.http_limits.body_timeout_s = {timeout:g}s"
            )
        )

    def _refuse(self, error: RequestError) -> None:
        """Answer `error` unless an answer has begun on this connection, and close it either way."""
        self._refusal = error
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # what connection_lost tells the application: the client is gone
            cycle.message_event.set()
            if cycle.response_started:
                self._disarm()
                self.transport.close()
                return
        self._close_with(error)

    def _close_with(self, error: RequestError) -> None:
        self._disarm()
        if self.transport.is_closing():
            return
        body = json.dumps(error.to_openai()).encode()
        head = [STATUS_LINE[error.status_code]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body)]
        self.transport.write(b"".join([*head, b"connection: close\r\n\r\n", body]))
        self.transport.close()

    def _arm(self, delay_s: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay_s, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def limited_protocol(limits: HttpLimits) -> type[LimitedHttpProtocol]:
    """The protocol class enforcing `limits` (uvicorn instantiates the class per connection)."""
    return type("LimitedHttpProtocol", (LimitedHttpProtocol,), {"limits": limits})


def uvicorn_options(limits: HttpLimits) -> dict[str, Any]:
    """`uvicorn.Config` keywords that serve with `limits`."""
    return {"http": limited_protocol(limits), "timeout_keep_alive": limits.idle_timeout_s}


def proxy_env(limits: HttpLimits) -> dict[str, str]:
    """The environment that makes a Ray Serve proxy process (or a direct-ingress replica) serve with `limits`."""
    return {CALLBACK_ENV: CALLBACK, LIMITS_ENV: limits.model_dump_json()}


def limits_from_env(env: Mapping[str, str]) -> HttpLimits:
    """The limits SPILLOVER_HTTP_LIMITS holds (JSON of `HttpLimits`); the defaults when it is unset or invalid."""
    raw = env.get(LIMITS_ENV)
    if not raw:
        return HttpLimits()
    try:
        return HttpLimits.model_validate_json(raw)
    except ValueError as exc:
        log.error("%s is not valid gateway.http_limits JSON (%s): serving with the defaults", LIMITS_ENV, exc)
        return HttpLimits()


class ProxyHttpProtocol(LimitedHttpProtocol):
    """`LimitedHttpProtocol` with the limits SPILLOVER_HTTP_LIMITS holds in this process's environment."""

    @classmethod
    def configured_limits(cls) -> HttpLimits:
        return _limits_of(os.environ.get(LIMITS_ENV, ""))


@functools.lru_cache(maxsize=4)
def _limits_of(raw: str) -> HttpLimits:
    return limits_from_env({LIMITS_ENV: raw})


def proxy_callback() -> list[Any]:
    """Ray Serve's HTTP proxy callback: in the proxy's process, before its uvicorn server is built, make
    `ProxyHttpProtocol` uvicorn's default ("auto") HTTP protocol.

    Serve passes no protocol of its own to `uvicorn.Config`, so uvicorn resolves "auto" through its
    `HTTP_PROTOCOLS` table when the server starts; the process serves nothing but Serve's proxy (or,
    with direct ingress, one replica's HTTP). No middleware is added: Serve expects a list."""
    from uvicorn import config as uvicorn_config

    uvicorn_config.HTTP_PROTOCOLS["auto"] = f"{__name__}:{ProxyHttpProtocol.__name__}"
    log.info("Serve's HTTP server uses %s: %s", ProxyHttpProtocol.__name__, ProxyHttpProtocol.configured_limits())
    return []
