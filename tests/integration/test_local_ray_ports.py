"""`spillover serve`'s own Ray (the stack's: no `cluster.address`) opens its ports on loopback only, and
refuses a caller without the token (serve_apps/runner.py; docs/security.md, "Ray's ports")."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import ray

from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration
RAY_AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def test_local_ray_listens_on_loopback_only(stack: Stack) -> None:
    """Every TCP port a process of this test session's Ray listens on (the driver started Ray, so they
    are all its descendants: GCS, raylet, agents, workers, Serve's proxy, the engines, the cloud-sims)."""
    family = [psutil.Process(), *psutil.Process().children(recursive=True)]
    pids = {p.pid for p in family}
    listening = [c for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN and c.pid in pids]
    assert listening, "no listening socket found for this session's processes"
    open_beyond = [
        (c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name())
        for c in listening
        if not ipaddress.ip_address(c.laddr.ip.removeprefix("::ffff:")).is_loopback
    ]
    assert not open_beyond, open_beyond


def test_ray_ports_refuse_unauthenticated_callers_of_the_local_ray(stack: Stack, tmp_path: Path) -> None:
    """A local user without the token (no RAY_AUTH_* variables, a HOME without ~/.ray/auth_token) is
    refused by the GCS; with this process's environment (the token's file) the same call works."""
    gcs = ray.get_runtime_context().gcs_address
    command = [sys.executable, "-m", "ray.scripts.scripts", "status", "--address", gcs]
    stranger = {k: v for k, v in os.environ.items() if k not in RAY_AUTH_VARS} | {"HOME": str(tmp_path)}
    refused = subprocess.run(command, env=stranger, capture_output=True, text=True, timeout=120)
    allowed = subprocess.run(
        command, env={**os.environ, "RAY_AUTH_MODE": "token"}, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode != 0
    assert "Authentication token is missing or incorrect" in refused.stdout + refused.stderr
    assert allowed.returncode == 0, allowed.stderr[-2000:]
