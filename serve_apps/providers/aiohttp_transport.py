"""The providers' HTTP transport: httpx's requests and responses on aiohttp's connection pool.

Every cloud call is an `httpx.Request` (built by serve_apps/providers/http_client.py, with its timeouts;
the tests answer it with `httpx.MockTransport`s); what sends the bytes is this `httpx.AsyncBaseTransport`. httpx's own
transport (httpcore on anyio, h11 in Python) was the largest single share of the gateway replica's
CPU per request in a py-spy profile under load; aiohttp parses HTTP in C and keeps the same
keep-alive pool. The figures are in the overhead report (`docs/bench.md`).

What it keeps of httpx's transport, so a provider cannot tell the difference:

- timeouts: the request's `timeout` extension (connect, read, pool) as aiohttp's sock_connect,
  sock_read and connect (which is where aiohttp waits for a pooled connection);
- errors as httpx raises them: `ConnectError`, `ConnectTimeout`, `ReadTimeout`, `RemoteProtocolError`
  (the server closed, or cut a body short), `ReadError` — the providers map those, not aiohttp's;
- the body as sent: no redirects followed, no cookies kept, no decompression here (httpx decodes
  `content-encoding` itself, as with its own transport), responses streamed as they arrive;
- TLS verified with httpx's context (its CA bundle, `SSL_CERT_FILE` / `SSL_CERT_DIR`);
- the pool: at most `max_connections` per transport, idle connections closed after `keepalive_s`.

A session belongs to the event loop that made it; a call from another loop (a probe run with
`asyncio.run`) gets a session of its own. `default_transport` falls back to httpx's transport where
the environment names a proxy (`HTTPS_PROXY` and friends), which httpx honours and this does not.
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
import weakref
from collections.abc import AsyncIterator

import aiohttp
import httpx

_KEEPALIVE_S = 5.0  # httpx's default keepalive_expiry
_MAX_CONNECTIONS = 100  # httpx's default max_connections
_CHUNK = 65536


def _httpx_error(exc: BaseException, request: httpx.Request, *, sent: bool) -> httpx.TransportError:
    """aiohttp's exception as the httpx one its own transport raises in the same case."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):  # connecting, or waiting for a pooled connection
        return httpx.ConnectTimeout(message, request=request)
    if isinstance(exc, TimeoutError):  # aiohttp.SocketTimeoutError: no byte for `read` seconds
        return httpx.ReadTimeout(message, request=request)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message, request=request)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(message, request=request)
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.UnsupportedProtocol(message, request=request)
    if isinstance(exc, aiohttp.ClientResponseError):  # a status line or header aiohttp could not parse
        return httpx.RemoteProtocolError(message, request=request)
    return httpx.ReadError(message, request=request) if sent else httpx.ConnectError(message, request=request)


class _Body(httpx.AsyncByteStream):
    """A response body as aiohttp receives it; closing returns (or drops) the connection."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_chunked(_CHUNK):
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _httpx_error(exc, self._request, sent=True) from exc

    async def aclose(self) -> None:
        self._response.release()  # back to the pool once read to the end; closed otherwise


class AiohttpTransport(httpx.AsyncBaseTransport):
    def __init__(
        self,
        *,
        max_connections: int = _MAX_CONNECTIONS,
        keepalive_s: float = _KEEPALIVE_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._max_connections = max_connections
        self._keepalive_s = keepalive_s
        self._ssl = ssl_context
        self._sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = (
            weakref.WeakKeyDictionary()
        )

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context()
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, limit_per_host=0, keepalive_timeout=self._keepalive_s, ssl=self._ssl
            )
            session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
                timeout=aiohttp.ClientTimeout(total=None),
            )
            self._sessions[loop] = session
        return session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        limits = request.extensions.get("timeout", {})
        timeout = aiohttp.ClientTimeout(
            total=None, connect=limits.get("pool"), sock_connect=limits.get("connect"), sock_read=limits.get("read")
        )
        headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in request.headers.raw]
        body = await request.aread()
        try:
            response = await self._session().request(
                request.method,
                str(request.url),
                headers=headers,
                data=body or None,
                allow_redirects=False,
                timeout=timeout,
                compress=False,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _httpx_error(exc, request, sent=False) from exc
        except ValueError as exc:  # a header aiohttp will not send (CR/LF in a value): h11 refuses it too
            raise httpx.LocalProtocolError(str(exc), request=request) from exc
        version = response.version or aiohttp.HttpVersion11
        return httpx.Response(
            status_code=response.status,
            headers=list(response.raw_headers),
            stream=_Body(response, request),
            extensions={"http_version": f"HTTP/{version.major}.{version.minor}".encode()},
        )

    async def aclose(self) -> None:
        """Close this loop's session; another live loop's session is closed on that loop."""
        sessions, self._sessions = list(self._sessions.items()), weakref.WeakKeyDictionary()
        running = asyncio.get_running_loop()
        for loop, session in sessions:
            if loop is running:
                await session.close()
            elif not loop.is_closed():
                asyncio.run_coroutine_threadsafe(session.close(), loop)


def default_transport() -> httpx.AsyncBaseTransport | None:
    """The transport a provider's client gets: this one, or None (httpx's own) where the environment
    names a proxy (read as httpx reads it), which httpx's transport honours."""
    return None if urllib.request.getproxies() else AiohttpTransport()
