"""A vLLM V1 stat logger that keeps the latest scheduler stats for the router.

vLLM calls every stat logger's `record(scheduler_stats, iteration_stats, ...)` once per engine
step from AsyncLLM's output handler (the same call that feeds its Prometheus metrics). The tap
keeps the last `SchedulerStats` it saw and accumulates prefix-cache counters; it is appended
to the running engine's `StatLoggerManager.stat_loggers` by the replica (serve_apps), so no
vLLM import is needed here — the objects are read by attribute, as vLLM defines them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TapReading:
    kv_cache_usage: float
    num_running: int
    num_waiting: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    last_step_at: float | None
    steps: int = 0  # scheduler steps recorded so far (a wedged engine's count stops)


class StatsTap:
    """Duck-typed vLLM stat logger (record / log / record_sleep_state / ...)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._kv_usage = 0.0
        self._running = 0
        self._waiting = 0
        self._queries = 0
        self._hits = 0
        self._last_step_at: float | None = None
        self._steps = 0

    def record(self, scheduler_stats: Any, iteration_stats: Any = None, **_: Any) -> None:
        if scheduler_stats is None:
            return
        self._kv_usage = float(getattr(scheduler_stats, "kv_cache_usage", 0.0))
        self._running = int(getattr(scheduler_stats, "num_running_reqs", 0))
        self._waiting = int(getattr(scheduler_stats, "num_waiting_reqs", 0))
        prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
        if prefix is not None:
            self._queries += int(getattr(prefix, "queries", 0))
            self._hits += int(getattr(prefix, "hits", 0))
        self._last_step_at = self._clock()
        self._steps += 1

    def reading(self, engine_idle: bool) -> TapReading:
        """The latest values. An idle engine (no unfinished requests) takes no steps, so its
        last step may still count the request that just finished: report it as empty."""
        if engine_idle:
            return TapReading(0.0, 0, 0, self._queries, self._hits, self._last_step_at, self._steps)
        return TapReading(
            self._kv_usage, self._running, self._waiting, self._queries, self._hits, self._last_step_at, self._steps
        )

    # The rest of vLLM's stat-logger interface: nothing to do.
    def log(self) -> None:
        return None

    def log_engine_initialized(self) -> None:
        return None

    def record_sleep_state(self, *args: Any, **kwargs: Any) -> None:
        return None

    def record_admission_rejection(self, *args: Any, **kwargs: Any) -> None:
        return None
