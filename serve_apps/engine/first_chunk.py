"""A streamed answer's first chunks at once, the rest batched: the client's first token waits for nothing.

Ray Serve LLM's `LLMServer` hands a streamed answer over in batches: its `Batcher` waits
`stream_batching_interval_ms` (50 ms by default, `RAYLLM_MODEL_RESPONSE_BATCH_TIMEOUT_MS`) and then yields what
the engine produced meanwhile — the first chunk included, so every local stream's time to first token grows
by up to one interval. Batching the later chunks pays: fewer, larger messages across Ray for the same tokens.

So `first_then_batched` reads the engine's stream in a task of its own, as Ray's Batcher does, and yields the
first batch as soon as anything arrived: everything the engine yielded in that step (vLLM's chat stream yields
its role chunk and the first token's chunk in one go, without waiting in between), so the first token is in
it. After that it batches every `interval_ms`, as Ray's does (0: whatever arrived, at once; None: everything
at the end). An error of the engine's stream is raised after the chunks that came before it; a consumer that stops
early cancels the reading.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import TypeVar

T = TypeVar("T")


async def first_then_batched(
    generator: AsyncGenerator[T, None], interval_ms: float | None
) -> AsyncGenerator[list[T], None]:
    items: list[T] = []
    arrived = asyncio.Event()

    async def read() -> None:
        try:
            async for item in generator:
                items.append(item)
                arrived.set()
        finally:
            arrived.set()

    reader = asyncio.get_running_loop().create_task(read())
    interval_s = None if interval_ms is None else interval_ms / 1000
    first = True
    try:
        while True:
            if first or interval_s == 0:
                await arrived.wait()
            elif interval_s is None:
                await asyncio.wait({reader})
            else:
                await asyncio.wait({reader}, timeout=interval_s)
            arrived.clear()
            batch, items[:] = list(items), []
            if batch:
                first = False
                yield batch
            if reader.done():
                if items:
                    yield list(items)
                reader.result()  # the engine stream's error, after what came before it
                return
    finally:
        if not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
