"""serve_apps/gateway.py: when Serve stops a gateway replica (it calls the deployment's `__del__` once, after the
replica's requests finished, and awaits it when it is a coroutine function), the background loops end and each
stop hook runs off the event loop: the spend rows and decision lines still queued get written."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, cast

import pytest

from serve_apps.gateway import Gateway
from serve_apps.off_loop.background_writer import BackgroundWriter


# Ray's ingress wrapper has an async `__del__` of its own: when the garbage collector later frees the instance it
# calls it too, unawaited, and Python warns. Serve's replicas do the same; it is not this test's subject.
@pytest.mark.filterwarnings("ignore:coroutine .*__del__' was never awaited:RuntimeWarning")
async def test_a_stopping_replica_ends_its_loops_and_writes_what_was_queued() -> None:
    written: list[int] = []
    gate = threading.Event()

    def slow_write(item: int) -> None:  # a disk that is slow right now: rows wait in the queue
        gate.wait(5)
        written.append(item)

    writer: BackgroundWriter[int] = BackgroundWriter(slow_write, name="test-ledger")
    for item in range(3):
        writer.submit(item)
    threads: list[str] = []

    def flush() -> None:
        threads.append(threading.current_thread().name)
        gate.set()
        assert writer.flush(5)

    wrapped = cast(Any, Gateway).func_or_class  # the class Serve instantiates: ours inside Ray's ingress wrapper
    replica = wrapped.__new__(wrapped)
    loop_task = asyncio.get_running_loop().create_task(asyncio.Event().wait())
    replica._tasks, replica._on_stop, replica._direct = [loop_task], [flush], None
    await replica.__del__()
    await asyncio.sleep(0)
    assert loop_task.cancelled() and written == [0, 1, 2]
    assert threads and threads[0] != threading.current_thread().name  # the loop was never blocked by the flush
    writer.close()
