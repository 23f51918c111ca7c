"""`spillover serve`'s own Ray (the stack's: no `cluster.address`) refuses a caller without its token on
every port it opens beyond loopback (Ray 2.60 binds its GCS, raylet and workers' RPC to every address
of the machine, whatever the node address asked for; docs/security.md, "Ray's ports")."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import grpc
import psutil
import pytest
import ray
from ray.core.generated import core_worker_pb2, core_worker_pb2_grpc

from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration
RAY_AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _worker_ports() -> dict[int, str]:
    """The ports this session's Ray workers (actors, Serve replicas, idle workers) listen on beyond
    loopback, by process title; the driver started Ray, so they are all its descendants."""
    titles = {p.pid: p.name() for p in psutil.Process().children(recursive=True)}
    workers = {pid for pid, title in titles.items() if title.startswith("ray::") and "Agent" not in title}
    return {
        c.laddr.port: titles[c.pid]
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
        and c.pid in workers
        and not ipaddress.ip_address(c.laddr.ip.removeprefix("::ffff:")).is_loopback
    }


def _call(port: int, metadata: list[tuple[str, str]]) -> grpc.StatusCode:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:  # the port listens on every address
        try:
            core_worker_pb2_grpc.CoreWorkerServiceStub(channel).NumPendingTasks(
                core_worker_pb2.NumPendingTasksRequest(), timeout=10, metadata=metadata
            )
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_ray_ports_refuse_unauthenticated_callers_of_the_local_ray(stack: Stack, tmp_path: Path) -> None:
    """A caller without the token (no RAY_AUTH_* variables, a HOME without ~/.ray/auth_token): the GCS
    refuses `ray status` and every RPC port of every worker answers UNAUTHENTICATED; with the token the
    same `ray status` works and the workers' RPC answers."""
    gcs = ray.get_runtime_context().gcs_address
    command = [sys.executable, "-m", "ray.scripts.scripts", "status", "--address", gcs]
    stranger = {k: v for k, v in os.environ.items() if k not in RAY_AUTH_VARS} | {"HOME": str(tmp_path)}
    refused = subprocess.run(command, env=stranger, capture_output=True, text=True, timeout=120)
    owner = {**os.environ, "RAY_AUTH_MODE": "token"}
    allowed = subprocess.run(command, env=owner, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0
    assert "Authentication token is missing or incorrect" in refused.stdout + refused.stderr
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    ports = _worker_ports()
    print(f"workers' ports beyond loopback: {sorted(ports.items())}")  # the record of what listens where
    assert any("SpilloverGateway" in title for title in ports.values()), ports
    anonymous = {port: _call(port, []) for port in ports}
    assert set(anonymous.values()) == {grpc.StatusCode.UNAUTHENTICATED}, anonymous
    token = (Path.home() / ".ray" / "auth_token").read_text().strip()
    with_token = {port: _call(port, [("authorization", f"Bearer {token}")]) for port in ports}
    # a core worker answers; a Serve replica's own gRPC port has no such method, but let the call in
    assert grpc.StatusCode.OK in with_token.values() and grpc.StatusCode.UNAUTHENTICATED not in with_token.values()
