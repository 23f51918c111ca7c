"""What a real GPU's NVML shows under a vLLM-like engine: `python -m tests.gpu.nvml_facts [--out F]`.

Run on a machine with an NVIDIA GPU and torch with CUDA. It measures what the simulation
(cluster/hardware/nvml_sim.py) has to reproduce, and prints one JSON document:

- `driver`: memory NVML counts as used before any process of ours holds a CUDA context;
- `engine`: a child process that reserves `gpu_memory_utilization × total` at start, as vLLM's
  engine does: its NVML process entry (is its PID the one we know, i.e. same PID namespace?), the
  CUDA context's own cost beyond the tensor, and the replica-side split (`ReplicaGpus`);
- `cotenants`: other processes allocating step by step until the free-memory floor
  `(1 − watermark) × total`: the pressure the router reads at each step against the one predicted
  by `others / (watermark × total − reservation)`;
- `read_ms`: the cost of one NVML read (the replica reads at every stats push).

This process never touches CUDA itself; all GPU memory is taken by child processes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from cluster.config.model_spec import DEFAULT_GPU_MEMORY_UTILIZATION
from cluster.hardware.nvml import GpuInfo, PynvmlReader
from router.routing.saturation import gpu_memory_pressure
from serve_apps.engine.gpus import ReplicaGpus, own_processes

GIB = 1024**3
WATERMARK = 0.95
HOLDER = """
import sys, torch
block = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
"""


def hold(nbytes: int) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(nbytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        raise RuntimeError(f"holder of {nbytes / GIB:.2f} GiB failed to start (rc {child.wait()})")
    return child


def device0(reader: PynvmlReader) -> GpuInfo:
    inventory = reader.read()
    if inventory.state != "ok":
        raise SystemExit(f"NVML: {inventory.state}: {inventory.reason}")
    return inventory.gpus[0]


def settle(reader: PynvmlReader, floor: int) -> GpuInfo:
    """NVML's counters can trail an allocation: read until used ≥ floor (at most 5 s)."""
    gpu = device0(reader)
    for _ in range(50):
        if gpu.memory_used >= floor:
            break
        time.sleep(0.1)
        gpu = device0(reader)
    return gpu


def processes(gpu: GpuInfo) -> list[dict[str, Any]] | None:
    if gpu.processes is None:
        return None
    return [
        {"pid": p.pid, "used_gib": None if p.used_bytes is None else round(p.used_bytes / GIB, 3)}
        for p in gpu.processes
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--fraction", type=float, default=DEFAULT_GPU_MEMORY_UTILIZATION)
    args = parser.parse_args()
    facts: dict[str, Any] = {"watermark": WATERMARK, "gpu_memory_utilization": args.fraction}
    children: list[subprocess.Popen[str]] = []
    with PynvmlReader() as reader:
        idle = device0(reader)
        total = idle.memory_total
        facts["device"] = {"name": idle.name, "total_gib": round(total / GIB, 2)}
        facts["driver"] = {"used_gib": round(idle.memory_used / GIB, 3), "processes": processes(idle)}
        timings = []
        for _ in range(50):
            start = time.perf_counter()
            reader.read()
            timings.append((time.perf_counter() - start) * 1000)
        facts["read_ms"] = {"p50": round(statistics.median(timings), 3), "max": round(max(timings), 3)}

        tensor = int(args.fraction * total) - GIB  # vLLM sizes its pool so the whole process fits the fraction
        engine = hold(tensor)
        children.append(engine)
        with_engine = settle(reader, idle.memory_used + tensor)
        listed = [p for p in with_engine.processes or () if p.pid == engine.pid]
        gpus = ReplicaGpus(reader, args.fraction, own_processes(engine.pid, [0]))
        (split,), error = gpus.read()
        facts["engine"] = {
            "pid": engine.pid,
            "tensor_gib": round(tensor / GIB, 3),
            "device_used_gib": round(with_engine.memory_used / GIB, 3),
            "process_entry_matches_pid": bool(listed),
            "processes": processes(with_engine),
            "context_gib": round((with_engine.memory_used - idle.memory_used - tensor) / GIB, 3),
            "attribution": split.attribution,
            "engine_gib": round(split.engine_bytes / GIB, 3),
            "others_gib": round(split.other_bytes / GIB, 3),
            "pressure_idle": round(gpu_memory_pressure(split, WATERMARK), 4),
            "read_error": error,
        }

        steps: list[dict[str, Any]] = []
        room = WATERMARK * total - max(split.engine_bytes, split.reserved_bytes)
        for gib in (1, 2, 2, 1):  # 1, 3, 5, 6 GiB of co-tenants on a device the engine holds 90% of
            before = device0(reader).memory_used
            try:
                children.append(hold(gib * GIB))
            except RuntimeError as exc:
                steps.append({"add_gib": gib, "error": str(exc)})
                break
            settle(reader, before + gib * GIB)
            (now,), _ = gpus.read()
            steps.append(
                {
                    "add_gib": gib,
                    "free_gib": round((now.total_bytes - now.used_bytes) / GIB, 3),
                    "others_gib": round(now.other_bytes / GIB, 3),
                    "pressure": round(gpu_memory_pressure(now, WATERMARK), 4),
                    "predicted": round(now.other_bytes / room, 4) if room > 0 else None,
                    "attribution": now.attribution,
                }
            )
        facts["cotenants"] = {"room_gib": round(room / GIB, 3), "steps": steps}
    for child in children:
        if child.stdin:
            child.stdin.close()
        child.wait(timeout=30)
    text = json.dumps(facts, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
