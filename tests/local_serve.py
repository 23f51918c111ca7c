"""`spillover serve` as a subprocess for the suites that start their own stack (tests/cloud_routes,
tests/gpu_sim), and free loopback ports for what they start."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(
    args: list[str], env: Mapping[str, str], log_path: Path, *, timeout_s: float, poll_s: float = 1.0
) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m spillover serve ARGS` logging to `log_path`, yielded once it says "spillover is serving" (the
    test fails with the log's tail if it exits or `timeout_s` passes first); stopped with SIGTERM as an
    operator stops it (its process group killed after 120 s), and the log's tail printed."""
    with log_path.open("w") as log:
        serve = subprocess.Popen(
            [sys.executable, "-m", "spillover", "serve", *args],
            cwd=REPO,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + timeout_s
            while "spillover is serving" not in log_path.read_text():
                if serve.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"spillover serve did not come up:\n{log_path.read_text()[-4000:]}")
                time.sleep(poll_s)
            yield serve
        finally:
            serve.send_signal(signal.SIGTERM)
            try:
                serve.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
                serve.wait()
            print(f"\n--- spillover serve log (tail) ---\n{log_path.read_text()[-2500:]}")
