"""One socket write per answer: the bytes a connection is given in one turn of the event loop go out together.

uvicorn writes a response's status line and headers, then its body, as two `transport.write` calls, so every
answer costs two `send` calls; on loopback each one also runs the peer's TCP receive path, and in a py-spy
profile of the gateway under load the writes to clients were the largest single cost of the replica. An ASGI
application sends its start and body messages in the same turn of the loop (nothing between them waits), so
`CoalescedWrites` holds what it is given and writes it once, at the end of that turn: a non-streamed answer
leaves in one `send`, a stream's chunks each in their turn, as before. Closing writes what is held first;
`abort` drops it, as the transport's own `abort` drops its buffer.
"""

from __future__ import annotations

import asyncio
from typing import Any


class CoalescedWrites:
    """`transport` with the writes of one loop turn joined into one (see the module docstring); every other
    attribute is the transport's own."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Write what is held now (the end of the turn, or before the connection closes)."""
        if not self._held:
            return
        data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        self._held.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
