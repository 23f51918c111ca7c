"""Run the cloud simulator as a child process (for `spillover serve --cloud-sim`, tests, bench)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx


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
    base URL (`.../v1`), and stop it on exit."""
    cmd = [sys.executable, "-m", "bench.cloud_sim", "--port", str(port), "--models", ",".join(models)]
    if log is not None:
        cmd += ["--log", str(log)]
    process = subprocess.Popen([*cmd, *extra_args])
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None:
                raise RuntimeError(f"cloud-sim exited with code {process.returncode} before answering")
            if time.monotonic() > deadline:
                raise RuntimeError(f"cloud-sim did not answer on port {port} within {start_timeout_s:g}s")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
