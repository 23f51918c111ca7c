"""End to end: `python -m bench calibrate` as a subprocess against a real cloud-sim subprocess.

The simulator admits 5 requests at once (more get 429 at once) and answers in ~0.1 s
(ttft 0.05 s + 8 tokens at 200 tok/s), so in the sweep 1,2,4,8 the level 8 fails by errors and the
knee is 4 on a quiet machine. On a loaded one the throughput of a lower level can beat level 4's by
more than 5% and move the knee down: what is checked is that it never passes the simulator's limit.
The config is configs/local.yaml with SmolLM2's config.json in a temporary model cache,
so the formula prediction runs the real `spillover capacity` path.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.cloud_sim.process import running_cloud_sim
from cluster.capacity.model_shape import SMOLLM2_135M
from cluster.models import MARKER

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.realtime  # real sleeps and servers: scripts/test runs it at normal priority
def test_calibrate_against_a_real_cloud_sim(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    folder = cache / "models" / MODEL
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(dict(SMOLLM2_135M)))
    (folder / MARKER).write_text("{}")
    out, overlay = tmp_path / "run", tmp_path / "overlay.yaml"
    sim_flags = ["--ttft-s", "0.05", "--tokens-per-s", "200", "--max-concurrency", "5"]
    with running_cloud_sim(free_port(), [MODEL], extra_args=sim_flags) as url:
        command = [
            sys.executable, "-m", "bench", "calibrate", "--url", url, "--direct-url", url, "--model", MODEL,
            "--concurrency", "1,2,4,8", "--requests-per-level", "8", "--warmup", "1",
            "--prompt", "fixed:16", "--output", "fixed:8", "--prefix-share", "0.5", "--slo-p95-s", "5",
            "--config", str(REPO / "configs" / "local.yaml"), "--out", str(out), "--overlay-out", str(overlay),
            "--no-progress", "--seed", "3",
        ]  # fmt: skip
        env = {**os.environ, "SPILLOVER_CACHE": str(cache)}
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "stage model" in done.stdout and "stage gateway" in done.stdout
    data = json.loads((out / "results.json").read_text())
    knees = []
    for stage in data["stages"]:
        knee, top = stage["knee"], stage["levels"][-1]
        # more than the simulator admits fails by errors, whatever the timing
        assert top["concurrency"] == 8 and top["summary"]["error_codes"].get("capacity_exceeded", 0) >= 1
        assert top["summary"]["error_rate"] > 0.01
        assert knee["concurrency"] in (1, 2, 4), knee["explanation"]
        if knee["concurrency"] == 4:
            assert knee["bound"] == "errors", knee["explanation"]
        knees.append(knee["concurrency"])
        assert stage["binding_bound"] == "compute/throughput"
        first = stage["levels"][0]
        assert first["summary"]["ok"] == 8 and first["summary"]["mean_output_tokens"] == 8
        # the simulator's configured delays are lower bounds: TTFT ≥ 0.05 s and e2e ≥ 0.05 + 7/200 s
        assert 0.05 <= first["summary"]["ttft_p50_s"] < 5.0
        assert 0.085 <= first["summary"]["e2e_p50_s"] < 5.0
        assert stage["notes"] == []
    assert f"recommended admission_limit: {knees[0]} per replica" in done.stdout
    assert data["prediction"]["status"] == "ok"
    assert data["prediction"]["report"]["kv_source"] == "kv_cache_space"

    report = (out / "report.md").read_text()
    assert f"**Knee: {knees[0]}**" in report and "more than 15%" in report
    for name in ("throughput.png", "latency.png"):
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
    text = overlay.read_text()
    assert text.startswith("# admission-limit overlay written by `python -m bench calibrate`")
    assert yaml.safe_load(text) == {"models": [{"alias": MODEL, "admission_limit": knees[0]}]}
