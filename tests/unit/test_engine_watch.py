"""A replica's view of its engine: thread binding (cluster/hardware/cpu_binding.py, serve_apps/engine/cpus.py),
stalls (serve_apps/engine/watchdog.py `StallWatch`) and the reaper that keeps engine processes from
outliving their replica (serve_apps/engine/reaper.py, with real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cluster.hardware.cpu_binding import bind_spec, choose_cores, physical_cores
from serve_apps.engine.cpus import claim_cores, release_cores
from serve_apps.engine.watchdog import StallWatch


def test_two_engines_on_two_cores_get_one_each() -> None:
    """What vLLM's own auto-binding got wrong on a 2-core machine: both engines on core 0."""
    first = choose_cores([0, 1], 1, {})
    second = choose_cores([0, 1], 1, {c: 1 for c in first})
    assert first == [0] and second == [1]
    assert choose_cores([0, 1], 1, {0: 1, 1: 1}) == [0]  # a third shares, lowest id first


def test_the_last_core_is_kept_while_others_are_free() -> None:
    assert choose_cores(list(range(8)), 4, {}) == [0, 1, 2, 3]
    assert choose_cores(list(range(8)), 4, {0: 1, 1: 1, 2: 1, 3: 1}) == [4, 5, 6, 7]
    assert choose_cores([0, 1], 2, {}) == [0, 1]  # all asked for: nothing is kept back
    assert choose_cores([0, 1], 5, {}) == [0, 1]  # never more than there are
    assert choose_cores([3], 1, {}) == [3]
    assert choose_cores([], 1, {}) == []


def test_one_logical_cpu_per_physical_core() -> None:
    topology = {0: (0, 0), 1: (0, 1), 2: (0, 0), 3: (0, 1)}  # 2 cores, 2 threads each
    assert physical_cores([0, 1, 2, 3], topology) == [0, 1]
    assert physical_cores([2, 3], topology) == [2, 3]
    assert physical_cores([0, 5], {0: (0, 0)}) == [0, 5]  # no topology for 5: a core of its own


def test_bind_spec_ranges() -> None:
    assert bind_spec([0]) == "0"
    assert bind_spec([3, 0, 1, 2, 8]) == "0-3,8"
    assert bind_spec([1, 3, 5]) == "1,3,5"


def test_claims_are_shared_between_processes_and_forget_the_dead(tmp_path: Path) -> None:
    """Two replica processes on one node: the second's engine avoids the first's cores; a claim
    whose process is gone is dropped (pid and start time must both match)."""
    cores = physical_cores(os.sched_getaffinity(0), {})
    if len(cores) < 2:
        pytest.skip("needs two CPUs")
    code = (
        "import sys, json; from pathlib import Path; from serve_apps.engine.cpus import claim_cores; "
        "b = claim_cores(1, Path(sys.argv[1])); print(json.dumps(list(b.cores)), flush=True); sys.stdin.read()"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout is not None
        theirs = json.loads(other.stdout.readline())
        mine = claim_cores(1, tmp_path)
        assert set(mine.cores).isdisjoint(theirs) and mine.others == {c: 0 for c in mine.cores}
        release_cores(tmp_path)
    finally:
        other.communicate("", timeout=30)
    (tmp_path / "999999.json").write_text(json.dumps({"pid": 999999, "started": 1.0, "cores": [cores[0]]}))
    again = claim_cores(1, tmp_path)
    assert again.others == {c: 0 for c in again.cores}  # the dead process's and the finished one's claims
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [f"{os.getpid()}.json"]
    release_cores(tmp_path)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_stall_counts_from_the_last_step_while_busy() -> None:
    clock = Clock()
    watch = StallWatch(30, clock)
    assert watch.stalled(busy=False, steps=5) is None
    clock.now += 500  # idle for long: no stall, nothing held
    assert watch.observe(busy=True, steps=5) == 0  # a request arrives: counted from now, not the old step
    clock.now += 29
    assert watch.stalled(busy=True, steps=5) is None
    clock.now += 2
    assert watch.stalled(busy=True, steps=5) == pytest.approx(31)
    assert watch.stalled(busy=True, steps=6) is None  # it stepped: progress


def test_requests_given_up_on_do_not_hide_a_stall() -> None:
    """Clients (or the gateway) give up on a frozen engine's requests after 10 s, before stall_s: the engine is
    idle for a moment, then the next request comes. Its stall goes on from the 10 s it held the first ones."""
    clock = Clock()
    watch = StallWatch(30, clock)
    assert watch.observe(busy=True, steps=7) == 0
    clock.now += 10
    assert watch.observe(busy=True, steps=7) == pytest.approx(10)  # frozen: no step since
    clock.now += 0.2
    assert watch.observe(busy=False, steps=7) is None  # every request was cancelled
    clock.now += 5
    assert watch.observe(busy=True, steps=7) == pytest.approx(10.2)  # the next request: the idle 5 s not counted
    clock.now += 20
    assert watch.stalled(busy=True, steps=7) == pytest.approx(30.2)
    assert watch.observe(busy=False, steps=8) is None  # it stepped: the sum starts again
    clock.now += 1
    assert watch.observe(busy=True, steps=8) == 0


def test_a_crawling_engine_that_steps_is_not_stalled() -> None:
    clock, steps = Clock(), 0
    watch = StallWatch(30, clock)
    for _ in range(20):
        clock.now += 20  # one step every 20 s: slow, yet moving
        steps += 1
        assert watch.stalled(busy=True, steps=steps) is None


def _wait_gone(pid: int, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


def test_reaper_kills_engines_of_a_killed_replica() -> None:
    """A stand-in replica starts a stand-in engine child (stopped with SIGSTOP, as a wedged one can be)
    and the reaper; the replica is SIGKILLed, as Serve or `ray stop` does: the engine dies too."""
    code = (
        "import os, signal, subprocess, sys, time, psutil\n"
        "from serve_apps.engine.reaper import start_reaper\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "os.kill(child.pid, signal.SIGSTOP)\n"
        "start_reaper([psutil.Process(child.pid)])\n"
        "print(child.pid, flush=True); time.sleep(600)\n"
    )
    replica = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert replica.stdout is not None
    engine = int(replica.stdout.readline())
    try:
        assert psutil.pid_exists(engine)
        replica.kill()
        replica.wait(timeout=10)
        assert _wait_gone(engine), "the engine process outlived its replica"
    finally:
        if psutil.pid_exists(engine):
            psutil.Process(engine).kill()
