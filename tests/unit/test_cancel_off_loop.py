"""serve_apps/engine/local_backend.py `cancel_off_loop`: the gateway cancels its calls to model replicas without
waiting on the cancel. The fake stream below behaves as Serve's `DeploymentResponseGenerator` does where it hurt:
its `cancel()` is synchronous and does not return until the replica's task ends (here: until the test lets it),
and its first item never comes (an engine frozen before the first byte)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from serve_apps.engine.local_backend import ServeHandleBackend, cancel_off_loop


class FrozenStream:
    """A streamed call to a replica whose engine is frozen: no item, and a cancel that waits for the task's end."""

    def __init__(self, separate_loop: bool = True) -> None:
        self._is_router_running_in_separate_loop = separate_loop
        self.task_ended = threading.Event()
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.task_ended.wait(5)
        self.cancelled.set()

    def __aiter__(self) -> FrozenStream:
        return self

    async def __anext__(self) -> Any:
        await asyncio.Event().wait()


class Handle:
    def __init__(self, stream: FrozenStream) -> None:
        self.stream = stream
        self.serve_body = self

    def options(self, **_: Any) -> Handle:
        return self

    def remote(self, *_: Any) -> FrozenStream:
        return self.stream


async def test_a_cancel_that_waits_does_not_hold_the_loop() -> None:
    stream = FrozenStream()
    cancel_off_loop(stream)  # returns while the cancel waits
    await asyncio.sleep(0)  # the loop runs on
    assert not stream.cancelled.is_set()
    stream.task_ended.set()
    assert await asyncio.to_thread(stream.cancelled.wait, 30)


async def test_a_failed_over_call_returns_at_once_and_is_cancelled_when_the_task_ends() -> None:
    stream = FrozenStream()
    backend = ServeHandleBackend({"m": Handle(stream)})  # type: ignore[dict-item]
    call = asyncio.create_task(backend.call("m", "chat", {"messages": []}, "r1"))
    await asyncio.sleep(0.01)
    call.cancel()  # the dispatcher gives up before the first byte (it fails over)
    with pytest.raises(asyncio.CancelledError):
        await call
    others = asyncio.create_task(asyncio.sleep(0, result="the loop is free"))
    assert await others == "the loop is free"
    assert not stream.cancelled.is_set()  # still waiting, in its own thread: the loop did not wait for it
    stream.task_ended.set()
    assert await asyncio.to_thread(stream.cancelled.wait, 30)


def test_where_the_router_shares_the_loop_the_cancel_stays_on_it() -> None:
    stream = FrozenStream(separate_loop=False)
    stream.task_ended.set()  # Serve's cancel does not wait in that mode
    cancel_off_loop(stream)
    assert stream.cancelled.is_set()  # done before it returned
