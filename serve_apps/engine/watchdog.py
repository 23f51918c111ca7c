"""A wedged engine is found by its replica and turned into a dead one, which everything handles.

vLLM's own health check asks only whether the engine has *died* (`AsyncLLM.check_health` reads an
error flag): an engine core that is stopped, deadlocked or spinning without taking steps answers
"healthy" while every request it holds waits — measured, six requests got nothing for 300 s while
Serve's health checks passed. The replica sees more: whether its engine holds unfinished requests and
when the engine last reported a scheduler step (cluster/stats_tap.py). `StallWatch` turns those into
"stalled for N s"; past `models[].stall_s` the replica

1. marks its stats with the fault (router/routing/snapshot.py `ReplicaStats.fault`): the gateways stop
   routing to it at their next snapshot;
2. kills its engine's processes (`kill_engine`: the `VLLM::` processes below the replica), so the
   requests it held fail at once with vLLM's engine-dead error — a request that has sent no byte
   fails over, a stream that has ends with the clean error event;
3. answers Serve's `check_health` with an error, so Serve replaces the replica.

Times are the replica's own monotonic clock: no comparison with another host's clock.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable

import psutil

log = logging.getLogger("spillover.watchdog")
ENGINE_PREFIX = "VLLM::"


class StallWatch:
    """How long the engine has held requests without a step (None while it steps or is idle).

    The time is summed over every spell it held requests since its last step: requests its clients or the
    gateway gave up on leave it idle for a moment, yet a wedged engine that took no step since is no less
    wedged when the next request comes (counted from that request alone, clients that give up sooner than
    `stall_s` would keep the stall from ever being seen). A healthy engine steps within a moment of any request,
    which starts the sum again."""

    def __init__(self, stall_s: float, clock: Callable[[], float]) -> None:
        self.stall_s = stall_s
        self._clock = clock
        self._busy_since: float | None = None
        self._last_step: float | None = None
        self._steps_seen = -1
        self._held_before = 0.0  # seconds held in earlier spells since the last step

    def observe(self, busy: bool, steps: int) -> float | None:
        """`busy`: the engine has unfinished requests; `steps`: its scheduler steps so far."""
        now = self._clock()
        if steps != self._steps_seen:
            self._steps_seen, self._last_step, self._held_before = steps, now, 0.0
        spell = 0.0
        if self._busy_since is not None:
            spell = now - max(self._busy_since, self._last_step or self._busy_since)
        if not busy:
            self._held_before += spell
            self._busy_since = None
            return None
        if self._busy_since is None:
            self._busy_since = now
        return self._held_before + spell

    def stalled(self, busy: bool, steps: int) -> float | None:
        """The stall's length once it passed `stall_s`, else None."""
        waited = self.observe(busy, steps)
        return waited if waited is not None and waited >= self.stall_s else None


def engine_processes(pid: int | None = None) -> list[psutil.Process]:
    """The vLLM engine processes (engine core, workers) below this replica process."""
    try:
        children = psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for child in children:
        try:
            if child.name().startswith(ENGINE_PREFIX) or any(ENGINE_PREFIX in part for part in child.cmdline()[:1]):
                out.append(child)
        except psutil.Error:
            continue
    return out


def kill_engine(reason: str) -> int:
    """SIGKILL every engine process of this replica (SIGKILL also ends a stopped one); how many."""
    killed = 0
    for proc in engine_processes():
        try:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        except psutil.Error:
            continue
    log.error("engine killed (%d processes): %s", killed, reason)
    return killed
