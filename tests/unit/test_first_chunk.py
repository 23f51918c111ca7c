"""serve_apps/engine/first_chunk.py: a local stream's first batch leaves as soon as the engine yielded, the rest in
batches. The fake engine streams as vLLM's chat stream does: its role chunk and first token's chunk in one step
(no wait between them), then one step per token, each awaiting the engine. No timing is asserted: the tests
hold the engine's next step until the first batch was seen, and end the stream to release a batch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from serve_apps.engine.first_chunk import first_then_batched


class Engine:
    def __init__(self, tokens: int = 3, fail_after: int | None = None) -> None:
        self.step = asyncio.Event()  # the engine's next step, released by the test
        self.tokens = tokens
        self.fail_after = fail_after
        self.closed = False

    async def stream(self) -> AsyncGenerator[str, None]:
        try:
            yield "role"
            yield "t0"  # the same step: vLLM yields both before awaiting the engine again
            for i in range(1, self.tokens):
                await self.step.wait()
                if self.fail_after is not None and i >= self.fail_after:
                    raise RuntimeError("engine died")
                yield f"t{i}"
        finally:
            self.closed = True


@pytest.mark.parametrize("interval_ms", [50.0, 10_000.0, None, 0])
async def test_the_first_batch_holds_the_first_token_before_the_engine_steps_again(interval_ms: float | None) -> None:
    engine = Engine()
    batches = first_then_batched(engine.stream(), interval_ms)
    assert await anext(batches) == ["role", "t0"]  # the engine's second step has not even been released
    engine.step.set()
    rest = [item async for batch in batches for item in batch]
    assert rest == ["t1", "t2"]


async def test_later_chunks_are_batched_and_the_end_of_the_stream_releases_the_last_batch() -> None:
    engine = Engine(tokens=6)
    batches = first_then_batched(engine.stream(), 10_000.0)  # an interval no test waits for
    await anext(batches)
    engine.step.set()
    assert [b async for b in batches] == [["t1", "t2", "t3", "t4", "t5"]]  # one batch: the stream's end sent it


async def test_an_engine_error_comes_after_the_chunks_before_it() -> None:
    engine = Engine(tokens=5, fail_after=2)
    batches = first_then_batched(engine.stream(), 10_000.0)
    seen = [await anext(batches)]
    engine.step.set()
    with pytest.raises(RuntimeError, match="engine died"):
        async for batch in batches:
            seen.append(batch)
    assert seen == [["role", "t0"], ["t1"]]


async def test_a_consumer_that_stops_early_stops_the_engine_stream() -> None:
    engine = Engine(tokens=100)
    batches = first_then_batched(engine.stream(), 50.0)
    await anext(batches)
    await batches.aclose()
    await asyncio.sleep(0)
    assert engine.closed


async def test_an_empty_stream_yields_nothing() -> None:
    async def empty() -> AsyncGenerator[str, None]:
        return
        yield  # pragma: no cover

    assert [b async for b in first_then_batched(empty(), 50.0)] == []
