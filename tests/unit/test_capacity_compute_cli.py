"""`spillover capacity --slo-e2e-p95-s / --slo-ttft-p95-s` (spillover/capacity.py): the compute bound beside
the KV-memory bound for a model with fitted `models[].perf`, and bad inputs refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_capacity_cli import parse, prepared_smollm2, record_bf16_failed, run, run_json

__all__ = ["prepared_smollm2"]  # the fixture, shared with test_capacity_cli.py

REPO = Path(__file__).resolve().parents[2]
PERF = {"request_overhead_s": 0.3, "step_s": 0.075, "per_sequence_s": 0.0085, "per_prefill_token_s": 0.0021,
        "tail_e2e": 1.05}  # fmt: skip


def config_with(tmp_path: Path, perf: Any) -> str:
    raw = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    raw["models"][0]["perf"] = perf
    path = tmp_path / "calibrated.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_compute_bound_binds_with_each_step_shown(tmp_path: Path, prepared_smollm2: Path) -> None:
    path = config_with(tmp_path, PERF)
    data = run_json("--config", path, "--prompt-tokens", "300", "--output-tokens", "64", "--slo-e2e-p95-s", "10")
    (model,) = data["models"]
    # memory (bf16 KV): ⌊93,184 / 364⌋ = 256, ⌊0.8 × 256⌋ = 204; compute: the simulated e2e p95 is
    # (5.1 + 1.174·N) × 1.05 while a burst fits the 2048-token budget: 9.05 s at 3, 10.29 s at 4
    assert (model["admission_limit"], model["bound"]) == (3, "compute")
    assert model["admission"]["memory_limit"] == 204 and model["admission"]["compute_limit"] == 3
    steps = {step[0]: step for step in model["admission"]["steps"]}
    assert list(steps)[-1] == "admission limit" and steps["compute bound"][1] == 3
    assert steps["e2e p95 at N=3 (s)"][1] == pytest.approx(9.0531) and steps["e2e p95 at N=4 (s)"][1] > 10
    assert steps["engine token budget"][1] == 2048
    assert data["inputs"]["slo_e2e_p95_s"] == 10
    code, text = run("--config", path, "--prompt-tokens", "300", "--output-tokens", "64", "--slo-e2e-p95-s", "10")
    assert code == 0
    assert "min(memory 204, compute 3) = 3 (compute binds)" in text
    assert "=> admission limit 3 concurrent sequences (memory 204 of a KV max 256, compute 3; bound: compute)" in text


def test_memory_binds_and_uncalibrated_models_say_so(tmp_path: Path, prepared_smollm2: Path) -> None:
    path = config_with(tmp_path, PERF)
    loose = run_json("--config", path, "--prompt-tokens", "300", "--output-tokens", "64", "--slo-e2e-p95-s", "500")
    assert (loose["models"][0]["admission_limit"], loose["models"][0]["bound"]) == (204, "memory")
    ttft = run_json("--config", path, "--prompt-tokens", "300", "--output-tokens", "64", "--slo-ttft-p95-s", "3")
    assert ttft["models"][0]["admission"]["compute_metric"] == "ttft"
    plain = run_json("--config", str(REPO / "configs" / "gpu-sim.yaml"), "--slo-e2e-p95-s", "10")
    for model in plain["models"]:
        if model["admission"]:
            assert model["bound"] == "memory" and model["admission"]["status"] == "uncalibrated"


@pytest.mark.parametrize(
    "argv",
    [["--slo-e2e-p95-s", "0"], ["--slo-e2e-p95-s", "-1"], ["--slo-ttft-p95-s", "fast"], ["--slo-ttft-p95-s", "inf"],
     ["--slo-e2e-p95-s", "nan"]],
)  # fmt: skip
def test_bad_slo_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    assert info.value.code == 2
    assert "slo" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("perf", "says"),
    [
        ({**PERF, "step_s": -0.1}, "models[0].perf.step_s"),
        ({**PERF, "per_sequence_s": 0, "per_prefill_token_s": 0}, "must be > 0"),
        ({**PERF, "slo_e2e_p95_s": "soon"}, "models[0].perf.slo_e2e_p95_s"),
        ({**PERF, "warp": 9}, "models[0].perf.warp"),
        ("fast", "models[0].perf"),
    ],
)
def test_bad_perf_config_is_exit_2_without_traceback(tmp_path: Path, perf: Any, says: str) -> None:
    path = config_with(tmp_path, perf)
    done = subprocess.run(
        [sys.executable, "-m", "spillover.main", "capacity", "--config", path, "--slo-e2e-p95-s", "10"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr
    assert json.dumps(perf) not in done.stdout


def test_the_committed_cpu_parameters_bind_on_compute(prepared_smollm2: Path) -> None:
    record_bf16_failed()  # the committed fit is float32 eager, what auto runs once bf16 has failed here
    local = str(REPO / "configs" / "local.yaml")
    data = run_json("--config", local, "--prompt-tokens", "300", "--output-tokens", "64", "--slo-e2e-p95-s", "10")
    (model,) = data["models"]
    assert model["bound"] == "compute" and model["admission_limit"] == model["admission"]["compute_limit"]
    assert model["admission_limit"] < model["admission"]["memory_limit"]
