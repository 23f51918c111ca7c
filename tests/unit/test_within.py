"""`within` (serve_apps/http/guards.py): a request's work under `gateway.request_timeout_s`, run in the
request's own task. What it must keep of its earlier form (the work in a task of its own): the work sees its
cut as a cancellation with the message `request_timeout` and unwinds before TimeoutError reaches the caller,
a cancellation of the request itself (the client left) stays a cancellation, and the task goes on normally
after a timeout (the cut is taken back, as `asyncio.timeout` takes its own back)."""

from __future__ import annotations

import asyncio

import pytest

from router.errors import RequestTimeout
from serve_apps.http.guards import within


async def test_the_result_when_in_time() -> None:
    async def work() -> str:
        await asyncio.sleep(0)
        return "answer"

    assert await within(work(), 5) == "answer"
    await asyncio.sleep(0)  # no cancellation left behind


async def test_a_cut_unwinds_the_work_with_its_message_before_the_timeout() -> None:
    seen: list[object] = []

    async def work() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError as cut:
            seen.append(cut.args[0] if cut.args else None)
            raise
        finally:
            await asyncio.sleep(0)  # unwinding may await (records, spend)
            seen.append("unwound")

    with pytest.raises(TimeoutError):
        await within(work(), 0.01)
    assert seen == [RequestTimeout.code, "unwound"]
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.001)  # the task goes on: nothing pending


async def test_work_that_swallows_the_cut_still_times_out() -> None:
    async def stubborn() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "late"
        return "never"

    with pytest.raises(TimeoutError):
        await within(stubborn(), 0.01)
    await asyncio.sleep(0)


async def test_the_clients_cancellation_passes_through() -> None:
    seen: list[object] = []

    async def work() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError as cut:
            seen.append(cut.args)
            raise

    request = asyncio.create_task(within(work(), 5))
    await asyncio.sleep(0.01)
    request.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await request
    assert seen == [()]  # not the timeout's message


async def test_an_error_of_the_work_is_its_own() -> None:
    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        await within(failing(), 5)
