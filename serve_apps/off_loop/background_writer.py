"""Writes that must not run on the event loop: a bounded queue drained by one daemon thread.

The gateway serves every request of a replica on one asyncio loop; a SQLite insert waiting on a
lock held by another process (up to its busy timeout) or an `open()` on a slow disk there stalls
every request. So the spend ledger and the decision log hand their writes to a
`BackgroundWriter`: `submit(item)` never blocks (when the queue is full the item is dropped and
counted), and the thread calls `write(item)`; an exception there is counted and logged, never
raised to the request that caused it. Writes keep their submission order.

    submitted   items accepted into the queue
    failures    write(item) raised
    dropped     the queue was full (the writer could not keep up) or the writer was closed

`flush(timeout_s)` waits until everything submitted so far is written (tests, shutdown);
`close()` stops the thread after the queue drains.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger("spillover.background")

T = TypeVar("T")
_STOP = object()


class BackgroundWriter(Generic[T]):
    def __init__(self, write: Callable[[T], None], *, name: str, max_queued: int = 10_000) -> None:
        self._write = write
        self.name = name
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_queued)
        self.submitted = 0
        self.failures = 0
        self.dropped = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"spillover-{name}", daemon=True)
        self._thread.start()

    def submit(self, item: T) -> bool:
        """Queue `item` for writing; False (and counted in `dropped`) when it cannot be."""
        if self._closed:
            self.dropped += 1
            return False
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("%s: queue full, %d writes dropped so far", self.name, self.dropped)
            return False
        self.submitted += 1
        return True

    def __call__(self, item: T) -> None:
        """A sink: `submit` without the result (e.g. DecisionStore's sink)."""
        self.submit(item)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every item submitted so far was written (or failed); False on timeout."""
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._write(item)  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 -- a failed write is counted, never raised to a request
                self.failures += 1
                log.warning("%s: write failed (%s): %s", self.name, type(exc).__name__, exc)
