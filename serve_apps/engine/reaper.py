"""Engine processes do not outlive their replica.

vLLM's engine core and workers are child processes of the model replica. When Serve (or `ray stop`,
or a stopped `spillover serve`) kills the replica's process outright, nothing in it runs to stop them:
measured, a `VLLM::EngineCore` and its `VLLM::Worker` stayed behind, bound to a core and holding
their KV cache, after the Ray that started them was gone. So the replica starts this small watcher in
a session of its own once its engine is up:

    python -m serve_apps.engine.reaper REPLICA_PID PID:START_TIME [PID:START_TIME ...]

It polls once a second; when the replica process is gone it SIGKILLs each engine process that is
still the one it was given (same pid *and* start time), then exits. It also exits once every engine
process is gone on its own (a restarted engine gets a watcher of its own).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Sequence

import psutil


def _same(pid: int, started: float) -> psutil.Process | None:
    try:
        proc = psutil.Process(pid)
        return proc if abs(proc.create_time() - started) < 1.0 else None
    except psutil.Error:
        return None


def watch(replica: int, replica_started: float, engines: Sequence[tuple[int, float]], poll_s: float = 1.0) -> int:
    """Block until the replica is gone (then kill the engines: how many) or every engine is gone (0)."""
    while True:
        alive = [p for pid, started in engines if (p := _same(pid, started)) is not None]
        if not alive:
            return 0
        if _same(replica, replica_started) is None:
            killed = 0
            for proc in alive:
                try:
                    proc.send_signal(signal.SIGKILL)
                    killed += 1
                except psutil.Error:
                    continue
            return killed
        time.sleep(poll_s)


def start_reaper(engines: Sequence[psutil.Process]) -> subprocess.Popen[bytes] | None:
    """Start the watcher for this process's engine processes (None when there are none)."""
    me = psutil.Process()
    pairs = []
    for proc in engines:
        try:
            pairs.append(f"{proc.pid}:{proc.create_time()}")
        except psutil.Error:
            continue
    if not pairs:
        return None
    cmd = [sys.executable, "-m", "serve_apps.engine.reaper", f"{me.pid}:{me.create_time()}", *pairs]
    return subprocess.Popen(
        cmd, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _pair(text: str) -> tuple[int, float]:
    pid, _, started = text.partition(":")
    return int(pid), float(started)


def main(argv: Sequence[str]) -> int:
    replica, replica_started = _pair(argv[0])
    watch(replica, replica_started, [_pair(a) for a in argv[1:]])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
