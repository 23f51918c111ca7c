"""Telemetry by subscription: the board's `watch` and the gateway's `BoardReader.run()`.

The board here is the real `BoardState`; its handle (`ActorLike`) behaves as a Ray actor handle does in the
way that matters: `.remote(...)` may be called from any thread and every method runs on the board's own
event loop (here the test's), answering the caller's loop through a future — so a push wakes every waiting
watch, as it does in the single-loop async actor. The reader's calls are recorded by the thread that made
them: none may come from the loop that serves requests.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from router.routing.watermarks import Watermarks
from serve_apps.telemetry.board import BoardState
from serve_apps.telemetry.board_reader import BoardReader
from tests.fakes import FakeClock

pytestmark = [pytest.mark.realtime, pytest.mark.timeout(60)]


def row(replica: str, kv: float = 0.1) -> dict[str, Any]:
    return ReplicaStats("m", replica, "node-1", 0.0, kv, 0, 0, 0, 0, 364, 128).to_dict()


class Method:
    def __init__(self, fn: Callable[..., Any], loop: asyncio.AbstractEventLoop, threads: list[str]) -> None:
        self._fn, self._loop, self._threads = fn, loop, threads

    def remote(self, *args: Any) -> Any:
        self._threads.append(threading.current_thread().name)

        async def run() -> Any:
            result = self._fn(*args)
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), self._loop))


class ActorLike:
    def __init__(self, board: BoardState, loop: asyncio.AbstractEventLoop, methods: tuple[str, ...]) -> None:
        self.threads: list[str] = []
        for name in methods:
            setattr(self, name, Method(getattr(board, name), loop, self.threads))


class HungWatch:
    """A board whose process stopped: its watch never answers."""

    def remote(self, *args: Any) -> Any:
        return asyncio.Event().wait()


async def until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.005)


async def test_watch_answers_on_a_push_and_otherwise_after_its_wait() -> None:
    board = BoardState(clock=FakeClock(10.0))
    version, rows = await board.watch(-1, 60)  # a version this board never gave: at once
    assert (version, rows) == (0, [])
    waiting = asyncio.create_task(board.watch(version, 60))
    await asyncio.sleep(0.02)
    assert not waiting.done()  # nothing pushed: it waits
    board.push(row("r1"))
    version, rows = await waiting
    assert version == 1 and [r["replica_id"] for r in rows] == ["r1"]
    assert await board.watch(version, 0.01) == (1, rows)  # its wait over, the rows as they are
    assert (await board.watch(57, 60))[0] == 1  # a version of an earlier board's life: at once


async def test_a_push_of_the_same_stats_keeps_the_row_fresh_without_waking_a_watch() -> None:
    clock = FakeClock(10.0)
    board = BoardState(clock=clock)
    board.push(row("r1"))
    version, _ = await board.watch(-1, 60)
    clock.now += 3.0
    waiting = asyncio.create_task(board.watch(version, 0.05))
    board.push({**row("r1"), "read_at": 99.0})  # an idle engine: only its read time moved
    after, rows = await waiting  # answered by its wait, not the push
    assert after == version and rows[0]["board_age_s"] == 0.0  # yet the row's age is the new push's
    board.push(row("r1", kv=0.5))
    assert (await board.watch(version, 60))[0] == version + 1


async def test_reader_follows_pushes_from_its_own_thread_and_refreshes_on_the_request_loop() -> None:
    board = BoardState(clock=FakeClock(10.0))
    handle = ActorLike(board, asyncio.get_running_loop(), ("watch", "snapshot"))
    refreshed: list[tuple[str, ClusterSnapshot]] = []
    reader = BoardReader(
        handle,
        min_interval_s=0.0,
        max_age_s=1.0,
        heartbeat_s=60.0,  # longer than the test: every answer below is a push's
        watermarks_for=lambda _: Watermarks(),
        on_refresh=lambda snapshot, _: refreshed.append((threading.current_thread().name, snapshot)),
    )
    running = asyncio.create_task(reader.run())
    try:
        await until(lambda: bool(refreshed))  # the first watch is answered at once: no replica yet
        assert refreshed[0][1].replicas == ()
        board.push(row("r1", kv=0.3))
        await until(lambda: bool(reader.latest().replicas))
        assert reader.latest().replicas[0].kv_cache_usage == 0.3
        board.push(row("r1", kv=0.7))
        await until(lambda: reader.latest().replicas[0].kv_cache_usage == 0.7)
        await until(lambda: refreshed[-1][1] is reader.latest())
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert set(handle.threads) == {"spillover-telemetry"}  # no actor call from the request loop
    assert {name for name, _ in refreshed} == {threading.current_thread().name}  # hooks on the request loop
    assert reader.answers == 3


async def test_a_board_without_watch_is_polled() -> None:
    """A detached board started by an older release has `snapshot` only."""
    board = BoardState(clock=FakeClock(10.0))
    board.push(row("r1"))
    handle = ActorLike(board, asyncio.get_running_loop(), ("snapshot",))
    reader = BoardReader(handle, min_interval_s=0.01, max_age_s=1.0, watermarks_for=lambda _: Watermarks())
    running = asyncio.create_task(reader.run())
    try:
        await until(lambda: reader.answers >= 3)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert [r.replica_id for r in reader.latest().replicas] == ["r1"] and set(handle.threads) == {"spillover-telemetry"}


async def test_a_hung_board_is_a_lost_board_and_its_rows_age_into_stale() -> None:
    board = BoardState(clock=FakeClock(10.0))
    board.push(row("r1"))
    handle = ActorLike(board, asyncio.get_running_loop(), ("watch", "snapshot"))
    clock = FakeClock(1000.0)
    reader = BoardReader(
        handle,
        min_interval_s=0.0,
        max_age_s=1.0,
        heartbeat_s=0.01,
        call_timeout_s=0.01,
        watermarks_for=lambda _: Watermarks(),
        clock=clock,
    )
    running = asyncio.create_task(reader.run())
    try:
        await until(lambda: bool(reader.latest().replicas))
        handle.watch = HungWatch()  # type: ignore[attr-defined]
        await until(lambda: bool(reader.latest().errors))
        assert "TimeoutError" in reader.latest().errors[0]
        clock.now += 5.0
        snapshot = reader.latest()
        assert [r.replica_id for r in snapshot.replicas] == ["r1"]
        assert snapshot.is_stale(snapshot.replicas[0], clock.now)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
