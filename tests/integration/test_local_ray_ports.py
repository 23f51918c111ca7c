"""`spillover serve`'s own Ray (the stack's: no `cluster.address`) refuses a caller without its token on
every port it opens beyond loopback (Ray 2.60 binds its GCS, raylet and workers' RPC to every address
of the machine, whatever the node address asked for; docs/security.md, "Ray's ports")."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
import ray
from ray.core.generated import core_worker_pb2
from ray.serve.generated import serve_pb2

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


# a method of each gRPC service a worker serves: a core worker's, and a Serve replica's own server's (a
# method a server does not have is UNIMPLEMENTED before Ray's interceptor looks at the token)
CORE_WORKER = ("/ray.rpc.CoreWorkerService/NumPendingTasks", core_worker_pb2.NumPendingTasksRequest())
SERVE_REPLICA = ("/ray.serve.ASGIService/HandleRequest", serve_pb2.ASGIRequest())


def _call(port: int, method: tuple[str, Any], metadata: list[tuple[str, str]]) -> grpc.StatusCode:
    path, request = method
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:  # the port listens on every address
        call = channel.unary_unary(path, request_serializer=type(request).SerializeToString)
        try:
            call(request, timeout=10, metadata=metadata)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_ray_ports_refuse_unauthenticated_callers_of_the_local_ray(stack: Stack, tmp_path: Path) -> None:
    """A caller without the token (no RAY_AUTH_* variables, a HOME without ~/.ray/auth_token): the GCS
    refuses `ray status` and every worker's RPC port (a core worker's, a Serve replica's own gRPC server)
    answers UNAUTHENTICATED; with the token the same `ray status` works and the core workers answer."""
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
    anonymous = {port: {_call(port, method, []) for method in (CORE_WORKER, SERVE_REPLICA)} for port in ports}
    refused = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNIMPLEMENTED}  # the other service's method
    assert all(grpc.StatusCode.UNAUTHENTICATED in codes and codes <= refused for codes in anonymous.values()), anonymous
    token = (Path.home() / ".ray" / "auth_token").read_text().strip()
    bearer = [("authorization", f"Bearer {token}")]
    answered = {port: _call(port, CORE_WORKER, bearer) for port in ports}
    assert grpc.StatusCode.OK in answered.values(), answered  # the core workers' RPC, with the token
