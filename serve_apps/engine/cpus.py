"""The cores each vLLM-CPU engine on this node holds: one claim file per engine, chosen under a lock.

`claim_cores` runs in a model replica before its engine starts: under an exclusive `flock` of
`<claims dir>/.lock` it reads every claim (`<pid>.json`: the replica's pid, its start time and its
cores), drops those whose process is gone (or whose pid now names another process), picks this
engine's cores (cluster/hardware/cpu_binding.py) and writes its own claim. The claim lives as long as the
replica process; a replica that dies leaves a file the next claim removes. The directory is under
/tmp: one per machine, as the cores are.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from cluster.hardware.cpu_binding import bind_spec, choose_cores, physical_cores

CLAIMS_DIR = Path("/tmp/spillover-engine-cpus")
_TOPOLOGY = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class Binding:
    cores: tuple[int, ...]
    spec: str  # VLLM_CPU_OMP_THREADS_BIND
    others: dict[int, int]  # core -> other engines on it when this one chose

    def describe(self) -> str:
        shared = [c for c in self.cores if self.others.get(c)]
        note = f"; shared with {sum(self.others[c] for c in shared)} other engine(s)" if shared else ""
        return f"{len(self.cores)} OpenMP thread(s) on core(s) {self.spec}{note}"


def core_topology(root: Path = _TOPOLOGY) -> dict[int, tuple[int, int]]:
    """cpu -> (package, core id) from sysfs (missing files: every CPU its own core)."""
    out: dict[int, tuple[int, int]] = {}
    for cpu in os.sched_getaffinity(0):
        base = root / f"cpu{cpu}" / "topology"
        try:
            out[cpu] = (int((base / "physical_package_id").read_text()), int((base / "core_id").read_text()))
        except (OSError, ValueError):
            continue
    return out


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _alive(pid: int, started: float) -> bool:
    try:
        return abs(psutil.Process(pid).create_time() - started) < 1.0
    except (psutil.Error, ValueError):
        return False


def _live_claims(folder: Path, me: int) -> dict[int, int]:
    counts: dict[int, int] = {}
    for path in folder.glob("*.json"):
        try:
            claim = json.loads(path.read_text())
            pid, started, cores = int(claim["pid"]), float(claim["started"]), [int(c) for c in claim["cores"]]
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if pid == me:
            continue
        if not _alive(pid, started):
            path.unlink(missing_ok=True)
            continue
        for core in cores:
            counts[core] = counts.get(core, 0) + 1
    return counts


def claim_cores(threads: int, folder: Path = CLAIMS_DIR) -> Binding:
    """This process's engine's cores (see the module docstring); the claim is written before returning."""
    me = os.getpid()
    cores = physical_cores(os.sched_getaffinity(0), core_topology())
    with _locked(folder):
        others = _live_claims(folder, me)
        chosen = choose_cores(cores, threads, others)
        claim = {"pid": me, "started": psutil.Process(me).create_time(), "cores": chosen}
        (folder / f"{me}.json").write_text(json.dumps(claim))
    return Binding(tuple(chosen), bind_spec(chosen), {c: others.get(c, 0) for c in chosen})


def release_cores(folder: Path = CLAIMS_DIR) -> None:
    (folder / f"{os.getpid()}.json").unlink(missing_ok=True)
