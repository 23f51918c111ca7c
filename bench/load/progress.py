"""A one-line progress display for load levels, on a text stream (stderr), no dependencies.

    [gateway c=4]  37/40 done  1 errors  12.3s

On a terminal (`live`) the line is rewritten in place (carriage return) at most every
`interval_s`; elsewhere (CI logs) only the final line of each level is written, and with `log_every_s` a
line at most that often as requests finish (long runs). `finish` ends
the line. The clock is injected; `NullProgress` shows nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TextIO


class ProgressSink(Protocol):
    def start(self, label: str, total: int) -> None: ...
    def advance(self, ok: bool) -> None: ...
    def finish(self) -> None: ...


class NullProgress:
    def start(self, label: str, total: int) -> None:
        pass

    def advance(self, ok: bool) -> None:
        pass

    def finish(self) -> None:
        pass


class LineProgress:
    def __init__(
        self,
        stream: TextIO,
        *,
        clock: Callable[[], float] = time.monotonic,
        live: bool | None = None,
        interval_s: float = 0.1,
        log_every_s: float | None = None,
    ) -> None:
        self._stream = stream
        self._clock = clock
        self._live = stream.isatty() if live is None else live
        self._interval_s = interval_s
        self._log_every_s = log_every_s
        self._label = ""
        self._total = 0
        self._done = 0
        self._errors = 0
        self._started = 0.0
        self._last_draw = float("-inf")
        self._width = 0

    def start(self, label: str, total: int) -> None:
        self._label, self._total, self._done, self._errors = label, total, 0, 0
        self._started = self._clock()
        self._last_draw = float("-inf") if self._live else self._started
        if self._live:
            self._draw()

    def advance(self, ok: bool) -> None:
        self._done += 1
        self._errors += 0 if ok else 1
        if self._live and (self._clock() - self._last_draw >= self._interval_s or self._done == self._total):
            self._draw()
        elif not self._live and self._log_every_s is not None and self._clock() - self._last_draw >= self._log_every_s:
            self._stream.write(self.line() + "\n")
            self._stream.flush()
            self._last_draw = self._clock()

    def finish(self) -> None:
        if self._live:
            self._draw()
            self._stream.write("\n")
        else:
            self._stream.write(self.line() + "\n")
        self._stream.flush()

    def line(self) -> str:
        elapsed = self._clock() - self._started
        return f"[{self._label}]  {self._done}/{self._total} done  {self._errors} errors  {elapsed:.1f}s"

    def _draw(self) -> None:
        text = self.line()
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self._stream.write("\r" + text + " " * pad)
        self._stream.flush()
        self._last_draw = self._clock()
