"""The time one request spends waiting on the shared store, for its `Server-Timing` header.

The gateway opens a `StoreTime` when a request arrives (`serve_apps/http/surface.py`) and sets it as the
current one of the request's task; every operation through `FallbackStore` (serve_apps/state/fallback.py)
adds its elapsed time to the current one. The answer's headers then say
`Server-Timing: store;dur=<ms>;desc="<n> ops"`: what the store added to this request's path, which
`bench overhead` reads per request (its `store` row, p50/p99). Writes that run off the request's path (a
task started without it: `off_path`) are not counted, nor is anything after the headers went out.

A `ContextVar` is how asyncio scopes a value to one request: each task reads the value of the context it
was started in, so concurrent requests never add to each other's.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

HEADER = "server-timing"


@dataclass
class StoreTime:
    ops: int = 0
    seconds: float = 0.0

    def add(self, seconds: float) -> None:
        self.ops += 1
        self.seconds += seconds

    def header(self) -> str:
        return f'store;dur={self.seconds * 1000:.3f};desc="{self.ops} ops"'


CURRENT: contextvars.ContextVar[StoreTime | None] = contextvars.ContextVar("spillover_store_time", default=None)


def begin() -> tuple[StoreTime, contextvars.Token[StoreTime | None]]:
    """A fresh StoreTime, current for this task and the tasks it starts; `CURRENT.reset(token)` ends it."""
    spent = StoreTime()
    return spent, CURRENT.set(spent)


def counted(seconds: float) -> None:
    spent = CURRENT.get()
    if spent is not None:
        spent.add(seconds)


def off_path() -> contextvars.Context:
    """The context to start a background write in (`asyncio.create_task(coro, context=off_path())`)."""
    context = contextvars.copy_context()
    context.run(CURRENT.set, None)
    return context


def parse(value: str | None) -> tuple[float, int] | None:
    """(milliseconds, ops) from a Server-Timing header that has a `store` entry; None otherwise."""
    for entry in (value or "").split(","):
        parts = [p.strip() for p in entry.split(";")]
        if parts[0] != "store":
            continue
        dur = ops = None
        for part in parts[1:]:
            name, _, raw = part.partition("=")
            try:
                if name == "dur":
                    dur = float(raw)
                elif name == "desc":
                    ops = int(raw.strip('"').split()[0])
            except (ValueError, IndexError):
                return None
        if dur is not None and dur >= 0:
            return dur, ops or 0
    return None
