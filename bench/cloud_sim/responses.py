"""The responses of the cloud simulator that a plain Starlette response cannot be: a connection reset, a reply
held back (and dropped if the client leaves), a concurrency slot given back however the response ended."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from bench.cloud_sim.faults import SimulatedCut

Sleep = Callable[[float], Awaitable[None]]


ABORT_SCOPE_KEY = "cloud_sim.abort"


class AbortableStarlette(Starlette):
    """Starlette that puts an `abort()` for the raw connection into the scope.

    uvicorn answers 500 when an app fails before its first byte, so a reset cannot be simulated
    by raising; it needs the transport. uvicorn's `send` is a bound method of the request cycle
    that holds it. Under another server (or httpx's ASGITransport) there is no abort and the
    reset fault raises `SimulatedCut` instead."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        transport = getattr(getattr(send, "__self__", None), "transport", None)
        if scope["type"] == "http" and transport is not None and hasattr(transport, "abort"):
            scope[ABORT_SCOPE_KEY] = transport.abort
        await super().__call__(scope, receive, send)


class Reset(Response):
    """Aborts the connection (TCP RST) without sending a byte."""

    def __init__(self) -> None:
        self.status_code = 0
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        abort = scope.get(ABORT_SCOPE_KEY)
        if abort is None:
            raise SimulatedCut("cloud-sim reset the connection (simulated, no transport to abort)")
        abort()


class Delayed(Response):
    """Sends `inner` after `delay_s` seconds, or nothing if the client leaves first."""

    def __init__(self, inner: Response, delay_s: float, sleep: Sleep) -> None:
        self._inner = inner
        self._delay_s = delay_s
        self._sleep = sleep
        self.status_code = inner.status_code

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._delay_s > 0 and await client_left_during(self._sleep(self._delay_s), receive):
            return
        await self._inner(scope, receive, send)


class Releasing(Response):
    """Runs `inner`, then gives the request's concurrency slot back, however it ended."""

    def __init__(self, inner: Response, release: Callable[[], None]) -> None:
        self._inner = inner
        self._release = release
        self.status_code = inner.status_code

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._inner(scope, receive, send)
        finally:
            self._release()


async def client_left_during(waiting: Awaitable[None], receive: Receive) -> bool:
    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    sleeper = asyncio.ensure_future(waiting)
    listener = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({sleeper, listener}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sleeper, listener):
            task.cancel()
        await asyncio.gather(sleeper, listener, return_exceptions=True)
    return listener in done
