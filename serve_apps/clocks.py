"""The clocks and the sleep an awaiting part of the gateway is injected with.

`clock` is monotonic: deadlines, waits and latencies run on it, so a wall-clock step never ends or
stretches a request. `wall` is epoch seconds: decision records' timestamps and the freshness of
engine stats (the snapshot's `read_at`, serve_apps/telemetry/board_reader.py) are on it. `sleep` is the one
pause every wait awaits, so a test can run them on a fake clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Clocks:
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    @classmethod
    def of(
        cls,
        clock: Callable[[], float] = time.monotonic,
        *,
        wall: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> Clocks:
        """The clocks of `clock` and `wall`; a lone injected `clock` is both (a fake clock in a test)."""
        if wall is None:
            wall = time.time if clock is time.monotonic else clock
        return cls(clock, wall, sleep)
