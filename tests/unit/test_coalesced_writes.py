"""`CoalescedWrites` (serve_apps/http/coalesce.py): the writes of one event-loop turn leave in one socket write.

The fake transport records `write` calls and behaves as asyncio's socket transport does where it matters here:
`is_closing()` turns true at `close()` or `abort()`, a closed transport takes no more writes, `abort` drops what
it was given. The end-to-end check uses uvicorn's real httptools protocol (through `LimitedHttpProtocol`) on
loopback: a non-streamed answer's status line, headers and body arrive in one `send`."""

from __future__ import annotations

import asyncio
import socket
from typing import Any, cast

import pytest
import uvicorn

from cluster.config.gateway import HttpLimits
from serve_apps.http.coalesce import CoalescedWrites
from serve_apps.http.limits import uvicorn_options


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "a write after close"
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


async def turn() -> None:
    await asyncio.sleep(0)


async def test_the_writes_of_one_turn_leave_together_in_order() -> None:
    raw = RecordingTransport()
    writes = CoalescedWrites(cast(asyncio.Transport, raw), asyncio.get_running_loop())
    writes.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    writes.write(b"")
    writes.write(bytearray(b"ok"))
    assert raw.writes == []  # held until the turn ends
    await turn()
    assert raw.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
    writes.writelines([b"a", b"b"])
    await turn()
    writes.write(b"c")
    await turn()
    assert raw.writes[1:] == [b"ab", b"c"]  # a later turn's writes are a write of their own
    assert writes.get_extra_info("peername") == ("127.0.0.1", 1)  # the rest is the transport's


async def test_close_writes_what_is_held_first_and_abort_drops_it() -> None:
    loop = asyncio.get_running_loop()
    raw = RecordingTransport()
    writes = CoalescedWrites(cast(asyncio.Transport, raw), loop)
    writes.write(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
    writes.close()
    assert raw.writes == [b"HTTP/1.1 408 Request Timeout\r\n\r\n"] and raw.closed
    await turn()  # the scheduled flush finds nothing held
    aborted = RecordingTransport()
    dropped = CoalescedWrites(cast(asyncio.Transport, aborted), loop)
    dropped.write(b"partial")
    dropped.abort()
    await turn()
    assert aborted.writes == [] and aborted.aborted
    gone = RecordingTransport()
    late = CoalescedWrites(cast(asyncio.Transport, gone), loop)
    late.write(b"for a peer that left")
    gone.closed = True  # the connection was lost before the turn ended
    await turn()
    assert gone.writes == []


async def chat_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    body = b'{"choices": []}'
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


@pytest.mark.realtime
@pytest.mark.timeout(30)
async def test_uvicorns_answer_arrives_in_one_segment() -> None:
    """uvicorn writes the head and the body separately; through `LimitedHttpProtocol` they leave in one send,
    so the first `recv` holds the whole answer (loopback delivers one send as one segment here)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(chat_app, host="127.0.0.1", port=port, lifespan="off", log_config=None,
                            access_log=False, **uvicorn_options(HttpLimits()))  # fmt: skip
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        await writer.drain()
        first = await asyncio.wait_for(reader.read(65536), 10)
        assert first.startswith(b"HTTP/1.1 200") and first.endswith(b'{"choices": []}')
        writer.close()
    finally:
        server.should_exit = True
        await task
