"""Run the cloud simulator as a child process (for `spillover serve --cloud-sim`, tests, bench)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from router.errors import SpilloverError


class CloudSimError(SpilloverError):
    """The cloud simulator could not be started here (`spillover serve --cloud-sim` says so in one line)."""


def _listened_on(port: int) -> bool:
    """True when a socket listens on 127.0.0.1:`port` (binding as the simulator's server would, address reuse on:
    only a listener, not a closing connection, makes it fail)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@contextmanager
def running_cloud_sim(
    port: int,
    models: Sequence[str],
    *,
    log: Path | None = None,
    extra_args: Sequence[str] = (),
    start_timeout_s: float = 30.0,
) -> Iterator[str]:
    """Start `python -m bench.cloud_sim` on 127.0.0.1:`port`, wait for /healthz, yield its
    base URL (`.../v1`), and stop it on exit. A port something already listens on is refused
    (`CloudSimError`) before anything starts: the /healthz that answered would be the other process's, and the
    requests meant for this simulator would go there."""
    if _listened_on(port):
        raise CloudSimError(
            f"port {port} is in use on 127.0.0.1 (another cloud-sim left running?): stop what listens there, or "
            "give the cloud-sim provider another port"
        )
    cmd = [sys.executable, "-m", "bench.cloud_sim", "--port", str(port), "--models", ",".join(models)]
    if log is not None:
        cmd += ["--log", str(log)]
    process = subprocess.Popen([*cmd, *extra_args])
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                answered = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                answered = False
            if process.poll() is not None:  # checked after an answer too: it must be this process's
                raise CloudSimError(f"cloud-sim exited with code {process.returncode} before answering")
            if answered:
                break
            if time.monotonic() > deadline:
                raise CloudSimError(f"cloud-sim did not answer on port {port} within {start_timeout_s:g}s")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
