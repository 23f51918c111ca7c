"""Hostile HTTP clients on raw sockets (loopback only), for the tests of `gateway.http_limits`.

Each attack returns an `Outcome`: the status line's code the server answered (None when it answered
nothing), whether it closed the connection, and after how many seconds. An attack gives up after
`within_s` and says so (`gave_up`): a server that neither answers nor closes by then failed.
"""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn

CHUNK = 64 * 1024


@contextmanager
def running_uvicorn(app: Any, **options: Any) -> Iterator[int]:
    """`app` served by a real uvicorn on 127.0.0.1 (a free port, yielded) in a thread of this process."""
    with running_server(
        uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning", **options)
    ) as port:
        yield port


@contextmanager
def running_server(config: uvicorn.Config) -> Iterator[int]:
    """A real uvicorn server of `config` (port 0: a free one, yielded) in a thread of this process."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield int(server.servers[0].sockets[0].getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@dataclass(frozen=True)
class Outcome:
    status: int | None
    closed: bool
    seconds: float
    gave_up: bool = False

    @property
    def refused(self) -> bool:
        """A 4xx answer or a closed connection, before the attack gave up."""
        return not self.gave_up and ((self.status is not None and 400 <= self.status < 500) or self.closed)


class _Conn:
    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.started = time.monotonic()
        self.reply = b""
        self.closed = False

    def poll(self, wait_s: float = 0.0) -> None:
        """Read what the server sent, if anything, within `wait_s`."""
        while not self.closed:
            readable, _, _ = select.select([self.sock], [], [], wait_s)
            if not readable:
                return
            try:
                data = self.sock.recv(CHUNK)
            except OSError:  # reset
                self.closed = True
                return
            if not data:
                self.closed = True
                return
            self.reply += data
            wait_s = 0.0

    def send(self, data: bytes) -> bool:
        """False once the server has closed or reset the connection."""
        try:
            self.sock.sendall(data)
        except OSError:
            self.closed = True
            return False
        return True

    def outcome(self, gave_up: bool = False) -> Outcome:
        self.sock.close()
        status = None
        if self.reply.startswith(b"HTTP/1."):
            status = int(self.reply.split(b" ", 2)[1])
        return Outcome(status, self.closed, time.monotonic() - self.started, gave_up)

    def wait_closed(self, within_s: float) -> Outcome:
        deadline = self.started + within_s
        while not self.closed and time.monotonic() < deadline:
            self.poll(min(0.2, max(0.0, deadline - time.monotonic())))
        return self.outcome(gave_up=not self.closed and not self.reply.startswith(b"HTTP/1."))


def _head(path: str = "/healthz") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: gateway\r\n".encode()


def huge_header(host: str, port: int, size: int = 32 * 1024 * 1024, within_s: float = 30) -> Outcome:
    """One header field of `size` bytes, sent as fast as the server takes it."""
    conn = _Conn(host, port)
    conn.send(_head() + b"X-Big: ")
    sent = 0
    while sent < size and not conn.closed and not conn.reply and time.monotonic() - conn.started < within_s:
        if not conn.send(b"a" * min(CHUNK, size - sent)):
            break
        sent += CHUNK
        conn.poll()
    if not conn.closed and not conn.reply:
        conn.send(b"\r\n\r\n")
    return conn.wait_closed(within_s)


def many_headers(host: str, port: int, count: int = 20_000, within_s: float = 30) -> Outcome:
    """`count` small header fields."""
    conn = _Conn(host, port)
    fields = b"".join(b"X-%d: v\r\n" % i for i in range(count))
    data = _head() + fields + b"\r\n"
    for start in range(0, len(data), CHUNK):
        if not conn.send(data[start : start + CHUNK]):
            break
        conn.poll()
        if conn.reply:
            break
    return conn.wait_closed(within_s)


def slow_loris(host: str, port: int, every_s: float = 1.0, within_s: float = 30) -> Outcome:
    """A head sent one byte every `every_s` seconds, never finished."""
    conn = _Conn(host, port)
    data = _head() + b"X-Slow: " + b"a" * 10_000
    for byte in data:
        if time.monotonic() - conn.started > within_s or not conn.send(bytes([byte])):
            break
        conn.poll(every_s)
        if conn.closed or conn.reply:
            break
    return conn.wait_closed(within_s)


def slow_body(host: str, port: int, path: str, every_s: float = 1.0, within_s: float = 30) -> Outcome:
    """A complete head announcing a 10,000-byte body, then the body one byte every `every_s` seconds."""
    conn = _Conn(host, port)
    conn.send(f"POST {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n".encode())
    conn.send(b"Content-Length: 10000\r\n\r\n")
    for _ in range(10_000):
        if time.monotonic() - conn.started > within_s or not conn.send(b" "):
            break
        conn.poll(every_s)
        if conn.closed or conn.reply:
            break
    return conn.wait_closed(within_s)


def idle(host: str, port: int, within_s: float = 30) -> Outcome:
    """A connection that never sends a byte."""
    return _Conn(host, port).wait_closed(within_s)


def idle_after_answer(host: str, port: int, within_s: float = 30) -> tuple[int | None, Outcome]:
    """One kept-alive request answered, then nothing: (that answer's status, what the idle wait ended in)."""
    conn = _Conn(host, port)
    conn.send(_head() + b"\r\n")
    deadline = time.monotonic() + 10
    while not _complete(conn.reply) and not conn.closed and time.monotonic() < deadline:
        conn.poll(0.2)
    status = int(conn.reply.split(b" ", 2)[1]) if conn.reply.startswith(b"HTTP/1.") else None
    conn.reply = b""
    conn.started = time.monotonic()
    return status, conn.wait_closed(within_s)


def _complete(reply: bytes) -> bool:
    """A whole answer with a content-length (what the attacks' requests get)."""
    head, sep, body = reply.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return True
