"""The providers' transport (httpx's client on aiohttp's pool) against a real HTTP server on loopback.

The server is aiohttp's own (`aiohttp.web`), listening on 127.0.0.1; every case is something a cloud
provider really does — streams its body, answers late, cuts a body short, redirects, compresses, sets a
cookie, refuses the connection — and each checks what httpx's own transport gives in that case, because
the providers map httpx's errors and read httpx's responses.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web

from serve_apps.providers.aiohttp_transport import AiohttpTransport, default_transport

pytestmark = [pytest.mark.realtime, pytest.mark.timeout(60)]


class Upstream:
    def __init__(self) -> None:
        self.seen: list[web.Request] = []
        self.bodies: list[bytes] = []
        self.release = asyncio.Event()

    async def echo(self, request: web.Request) -> web.Response:
        self.seen.append(request)
        self.bodies.append(await request.read())
        return web.json_response({"ok": True}, headers={"x-ratelimit-remaining-requests": "9", "set-cookie": "a=b"})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: first\n\n")
        await self.release.wait()  # the client must see the first event while the rest is held back
        await response.write(b"data: [DONE]\n\n")
        return response

    async def slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(text="late")

    async def cut(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-length": "1000"})
        await response.prepare(request)
        await response.write(b"x" * 10)
        assert request.transport is not None
        request.transport.close()  # 10 of the 1000 promised bytes, then the connection closes
        return response

    async def redirect(self, request: web.Request) -> web.Response:
        return web.Response(status=307, headers={"location": "http://169.254.169.254/"})

    async def gzipped(self, request: web.Request) -> web.Response:
        return web.Response(body=gzip.compress(b'{"z": 1}'), headers={"content-encoding": "gzip"})

    async def big(self, request: web.Request) -> web.Response:
        return web.Response(body=b"y" * 1_000_000)


Served = tuple[str, Upstream]  # the server's base URL, and what it saw


@pytest.fixture
async def upstream() -> AsyncIterator[Served]:
    state = Upstream()
    app = web.Application()
    app.router.add_post("/echo", state.echo)
    app.router.add_get("/echo", state.echo)
    app.router.add_get("/stream", state.stream)
    app.router.add_get("/slow", state.slow)
    app.router.add_get("/cut", state.cut)
    app.router.add_get("/redirect", state.redirect)
    app.router.add_get("/gzip", state.gzipped)
    app.router.add_get("/big", state.big)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", state
    state.release.set()
    await runner.cleanup()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=AiohttpTransport(), timeout=httpx.Timeout(2.0)) as c:
        yield c


async def test_a_json_post_arrives_as_sent_and_its_answer_comes_back_whole(
    upstream: Served, client: httpx.AsyncClient
) -> None:
    base, state = upstream
    response = await client.post(f"{base}/echo", json={"model": "m"}, headers={"authorization": "Bearer k"})
    assert response.status_code == 200 and response.json() == {"ok": True}
    assert response.headers["x-ratelimit-remaining-requests"] == "9"
    request = state.seen[0]
    assert state.bodies[0] == b'{"model":"m"}'
    assert request.headers["content-type"] == "application/json"
    assert request.headers["authorization"] == "Bearer k"
    assert request.headers["user-agent"].startswith("python-httpx/")  # httpx's headers, not aiohttp's


async def test_a_stream_is_read_as_it_arrives(upstream: Served, client: httpx.AsyncClient) -> None:
    base, state = upstream
    async with client.stream("GET", f"{base}/stream") as response:
        chunks = response.aiter_bytes()
        assert await asyncio.wait_for(chunks.__anext__(), 2) == b"data: first\n\n"
        state.release.set()
        assert b"".join([c async for c in chunks]) == b"data: [DONE]\n\n"


async def test_no_byte_for_the_read_timeout_is_httpx_read_timeout(upstream: Served) -> None:
    base, _ = upstream
    async with httpx.AsyncClient(transport=AiohttpTransport(), timeout=httpx.Timeout(0.3)) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.get(f"{base}/slow")


async def test_a_refused_connection_is_httpx_connect_error(client: httpx.AsyncClient) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: the connection is refused
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{port}/")


async def test_a_body_cut_short_is_httpx_remote_protocol_error(upstream: Served, client: httpx.AsyncClient) -> None:
    base, _ = upstream
    with pytest.raises(httpx.RemoteProtocolError):
        await client.get(f"{base}/cut")


async def test_redirects_are_not_followed_and_the_transport_keeps_no_cookies(
    upstream: Served, client: httpx.AsyncClient
) -> None:
    base, state = upstream
    response = await client.get(f"{base}/redirect")
    assert response.status_code == 307  # nothing fetched from where the provider points
    transport = AiohttpTransport()  # the client's cookie jar is httpx's; the transport adds none of its own
    for _ in range(2):
        answer = await transport.handle_async_request(httpx.Request("GET", f"{base}/echo"))
        assert answer.headers["set-cookie"] == "a=b"
        await answer.aclose()
    await transport.aclose()
    assert "cookie" not in {k.lower() for k in state.seen[-1].headers}


async def test_a_compressed_body_is_decoded_once_by_httpx(upstream: Served, client: httpx.AsyncClient) -> None:
    base, _ = upstream
    response = await client.get(f"{base}/gzip")
    assert response.json() == {"z": 1}


async def test_a_body_left_unread_frees_the_pool_for_the_next_request(upstream: Served) -> None:
    base, _ = upstream
    transport = AiohttpTransport(max_connections=1)
    async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(2.0)) as c:
        for _ in range(3):  # with one connection, a leaked one would make the second request wait forever
            async with c.stream("GET", f"{base}/big") as response:
                assert len(await response.aiter_bytes().__anext__()) > 0
        assert (await c.get(f"{base}/echo")).status_code == 200


async def test_a_header_that_cannot_be_sent_is_httpx_local_protocol_error(upstream: Served) -> None:
    # an API key read from a file with its newline: httpx's transport refuses it the same way, before sending
    base, state = upstream
    transport = AiohttpTransport()
    request = httpx.Request("GET", f"{base}/echo", headers={"authorization": "Bearer k\nx-injected: 1"})
    with pytest.raises(httpx.LocalProtocolError):
        await transport.handle_async_request(request)
    await transport.aclose()
    assert not state.seen


def test_an_environment_proxy_keeps_httpx_own_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(default_transport(), AiohttpTransport)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert default_transport() is None
