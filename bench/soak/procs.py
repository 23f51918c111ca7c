"""Which processes of this machine are the stack `bench soak` watches, and their RSS and open FDs (psutil).

A process is the stack's when it runs as this user and its name or command line says what it is
(`classify`, first match):

    VLLM::*                       a vLLM engine process (`VLLM::EngineCore`, `VLLM::Worker...`)
    ray::...ServeReplica:APP:DEP  a Serve replica (the gateway, a model replica): "ServeReplica:APP:DEP"
    ray::NAME                     another Ray worker or actor (ServeController, ProxyActor, IDLE, a task)
    raylet, gcs_server            Ray's node and cluster daemons
    python .../ray/...            Ray's Python daemons: dashboard, dashboard agent, log monitor, monitor,
                                  runtime-env agent
    python -m bench.cloud_sim     the cloud simulator, only the one on the soak's `--sim` port (tests
                                  beside it start simulators of their own)
    spillover serve|deploy        the command that started the stack

Ray titles a process after the method it runs ("ray::ServeController.listen_for_change"): the method
is dropped, and a process keeps the role it had when first seen, so one pid is one series. Processes
that vanish between listing and reading are skipped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import psutil

from bench.soak.metrics import ProcSample

RAY_DAEMONS = (
    ("ray/dashboard/dashboard.py", "ray dashboard"),
    ("ray/dashboard/agent.py", "ray dashboard agent"),
    ("ray/_private/log_monitor.py", "ray log monitor"),
    ("ray/autoscaler/_private/monitor.py", "ray monitor"),
    ("ray/_private/runtime_env/agent/main.py", "ray runtime-env agent"),
)
CLOUD_SIM_DEFAULT_PORT = 9100
_METHOD = re.compile(r"\.[A-Za-z_][A-Za-z0-9_]*(?:\(\))?$")  # "ray::X.method": the task running now


def _port_arg(cmdline: Sequence[str]) -> int | None:
    for i, arg in enumerate(cmdline):
        text = None
        if arg == "--port" and i + 1 < len(cmdline):
            text = cmdline[i + 1]
        elif arg.startswith("--port="):
            text = arg.split("=", 1)[1]
        if text is not None:
            return int(text) if text.isdigit() else None
    return CLOUD_SIM_DEFAULT_PORT


def classify(name: str, cmdline: Sequence[str], *, sim_port: int | None = None) -> str | None:
    """The role of a process in the stack, or None when it is not the stack's (module docstring)."""
    title = cmdline[0] if cmdline else name
    if title.startswith("VLLM::") or name.startswith("VLLM::"):
        return (title if title.startswith("VLLM::") else name).split()[0]
    if title.startswith("ray::"):
        head = title.split()[0]
        if "ServeReplica:" in head:
            return _METHOD.sub("", "ServeReplica:" + head.rsplit("ServeReplica:", 1)[1])
        return _METHOD.sub("", head)
    if name in ("raylet", "gcs_server"):
        return name
    joined = " ".join(cmdline)
    for marker, role in RAY_DAEMONS:
        if marker in joined:
            return role
    if "bench.cloud_sim" in cmdline or (_is_spillover(cmdline) and "cloud-sim" in cmdline):
        return "cloud-sim" if sim_port is not None and _port_arg(cmdline) == sim_port else None
    if _is_spillover(cmdline) and ("serve" in cmdline or "deploy" in cmdline):
        return "spillover " + ("serve" if "serve" in cmdline else "deploy")
    return None


def _is_spillover(cmdline: Sequence[str]) -> bool:
    return any(os.path.basename(arg) == "spillover" for arg in cmdline[:3])


class ProcessSampler:
    """Samples the stack's processes; remembers each pid's first role."""

    def __init__(self, *, sim_port: int | None, own_pid: int | None = None) -> None:
        self._sim_port = sim_port
        self._own_pid = os.getpid() if own_pid is None else own_pid
        self._uid = os.getuid()
        self._roles: dict[int, str] = {}

    def sample(self, t: float) -> list[ProcSample]:
        found = []
        for proc in psutil.process_iter(["pid", "name", "cmdline", "uids"]):
            try:
                info = proc.info
                uids = info.get("uids")
                if info["pid"] == self._own_pid or uids is None or uids.real != self._uid:
                    continue
                role = self._roles.get(info["pid"]) or classify(
                    info.get("name") or "", info.get("cmdline") or [], sim_port=self._sim_port
                )
                if role is None:
                    continue
                rss, fds = proc.memory_info().rss, proc.num_fds()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            self._roles.setdefault(info["pid"], role)
            found.append(ProcSample(t, self._roles[info["pid"]], info["pid"], rss, fds))
        return found
