"""`gateway.direct_port`: the gateway replica's own listener (serve_apps/http/direct.py), real uvicorn on loopback.

Two `DirectListener`s in this process stand for two gateway replicas on one node: both bind the same port
(SO_REUSEPORT, as two replica processes of one user do), a client reaches the gateway through either, one
that drains lets its open request finish while new connections reach the other, and the limits of
`gateway.http_limits` hold on this port as on the proxy's.
"""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from cluster.config.gateway import GatewaySection, HttpLimits
from serve_apps.http.direct import DirectListener
from tests import http_attacks as attack
from tests.unit import limited_gateway

pytestmark = [pytest.mark.realtime, pytest.mark.timeout(60)]

HOST = "127.0.0.1"
LIMITS = HttpLimits(max_header_bytes=16 * 1024, max_headers=50, header_timeout_s=1, body_timeout_s=1, idle_timeout_s=1)
CHAT = {"model": "small", "messages": [{"role": "user", "content": "capital of France?"}]}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def gateway_app(replica: str) -> object:
    return limited_gateway.gateway_app(LIMITS, answer=f"from {replica}")


def slow_app(name: str, release: asyncio.Event) -> Starlette:
    async def slow(_: Request) -> PlainTextResponse:
        await release.wait()
        return PlainTextResponse(f"slow from {name}")

    async def who(_: Request) -> PlainTextResponse:
        return PlainTextResponse(name)

    return Starlette(routes=[Route("/slow", slow), Route("/who", who)])


async def test_two_replicas_share_the_port_and_serve_the_gateway() -> None:
    port = free_port()
    a = DirectListener(gateway_app("a"), HOST, port, LIMITS)
    b = DirectListener(gateway_app("b"), HOST, port, LIMITS)
    await a.start()
    await b.start()  # the second replica on the node binds the same port
    try:
        answers = set()
        for _ in range(40):  # a new connection each time: the kernel spreads them
            async with httpx.AsyncClient(base_url=f"http://{HOST}:{port}", timeout=10) as client:
                reply = await client.post("/v1/chat/completions", json=CHAT)
                assert reply.status_code == 200, reply.text
                answers.add(reply.json()["choices"][0]["message"]["content"])
        assert answers <= {"from a", "from b"} and answers
    finally:
        await a.stop()
        await b.stop()


async def test_the_http_limits_hold_on_the_direct_port() -> None:
    port = free_port()
    listener = DirectListener(gateway_app("a"), HOST, port, LIMITS)
    await listener.start()
    try:
        outcome = await asyncio.to_thread(attack.huge_header, HOST, port, within_s=15)
        assert outcome.refused and outcome.status in (None, 431), outcome
    finally:
        await listener.stop()


async def test_a_draining_replica_finishes_its_request_and_new_connections_reach_the_other() -> None:
    port = free_port()
    release = asyncio.Event()
    leaving = DirectListener(slow_app("leaving", release), HOST, port, LIMITS, grace_s=30)
    staying = DirectListener(slow_app("staying", release), HOST, port, LIMITS)
    await leaving.start()
    async with httpx.AsyncClient(base_url=f"http://{HOST}:{port}", timeout=30) as client:
        in_flight = asyncio.create_task(client.get("/slow"))  # only `leaving` listens yet: it takes this one
        await asyncio.sleep(0.2)
        await staying.start()
        stopping = asyncio.create_task(leaving.stop())
        await asyncio.sleep(0.3)  # its socket is closed: new connections go to the other replica
        try:
            for _ in range(10):
                async with httpx.AsyncClient(base_url=f"http://{HOST}:{port}", timeout=10) as fresh:
                    assert (await fresh.get("/who")).text == "staying"
            assert not stopping.done()  # still waiting for its open request
            release.set()
            reply = await in_flight
            assert (reply.status_code, reply.text) == (200, "slow from leaving")  # finished, not cut
            await stopping
        finally:
            release.set()
            await staying.stop()


async def test_a_connection_accepted_just_before_the_drain_still_gets_its_answer() -> None:
    """A client connects (the replica accepts), the replica starts draining, then the request's bytes arrive: the
    connection is not closed as idle under the request (uvicorn's shutdown closes connections with no request
    under way), the answer comes back."""
    port = free_port()
    listener = DirectListener(slow_app("leaving", asyncio.Event()), HOST, port, LIMITS)
    await listener.start()
    reader, writer = await asyncio.open_connection(HOST, port)
    await asyncio.sleep(0.1)  # accepted: the connection is the replica's, with no request yet
    stopping = asyncio.create_task(listener.stop())
    await asyncio.sleep(0.3)  # the listener is closed; uvicorn's own shutdown would have begun within 0.1 s
    writer.write(f"GET /who HTTP/1.1\r\nhost: {HOST}\r\n\r\n".encode())
    await writer.drain()
    head = await asyncio.wait_for(reader.read(4096), 10)
    writer.close()
    await stopping
    assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"leaving"), head


async def test_a_port_taken_by_a_plain_socket_is_an_error_at_start() -> None:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            await DirectListener(slow_app("x", asyncio.Event()), HOST, port, LIMITS).start()


def test_the_direct_port_is_not_the_proxy_port() -> None:
    with pytest.raises(ValidationError, match=r"direct_port 8000 is gateway\.port"):
        GatewaySection(port=8000, direct_port=8000)
    assert GatewaySection(direct_port=8001).direct_port == 8001
