"""bench.calibrate.report / bench.calibrate.plots: results.json, report.md and valid PNGs from synthetic sweeps."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from bench.calibrate.formula import FormulaPrediction
from bench.calibrate.knee import find_knee
from bench.calibrate.report import CalibrationRun, environment, render_markdown, write_report
from bench.calibrate.run import write_overlay
from bench.calibrate.sweep import LevelResult, StageResult, SweepPlan
from bench.load.request_result import RequestResult
from bench.load.stats import summarize
from bench.load.workload import LengthDist, WorkloadSpec
from cluster.capacity.memory import plan_capacity
from cluster.capacity.model_shape import SMOLLM2_135M, ModelShape
from cluster.config.deployment import parse_config

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLAN = SweepPlan(concurrency=(1, 2, 4, 8), requests_per_level=6, warmup=1, slo_p95_s=2.0)
WORKLOAD = WorkloadSpec(LengthDist.parse("fixed:256"), LengthDist.parse("fixed:64"), prefix_share=0.5)


def level(concurrency: int, t0: float, e2e: float, *, cloud_every: int = 0, errors: int = 0) -> LevelResult:
    results = []
    for i in range(8):
        route = None if cloud_every < 0 else ("cloud" if cloud_every and i % cloud_every == 0 else "local")
        error = "capacity_exceeded" if i < errors else None
        start = t0 + i * e2e / concurrency
        measured = {"output_tokens": 64, "prompt_tokens": 260, "cached_tokens": 128, "status": 429 if error else 200}
        results.append(
            RequestResult(i, start, e2e, ttft_s=e2e / 4, error=error, route=route, warmup=i == 0, **measured)
        )
    return LevelResult(concurrency, summarize(results), tuple(results))


def stage(name: str, *, routes: bool) -> StageResult:
    every = 3 if routes else -1
    levels = (
        level(1, 0.0, 0.5, cloud_every=0 if routes else -1),
        level(2, 10.0, 0.6, cloud_every=0 if routes else -1),
        level(4, 20.0, 0.9, cloud_every=every),
        level(8, 30.0, 3.0, cloud_every=every, errors=3),
    )
    knee = find_knee([lv.point("e2e") for lv in levels], PLAN.slo_p95_s)
    return StageResult(name, f"http://127.0.0.1:8000/{name}/v1", "smollm2", PLAN, levels, knee)


def prediction(replicas: int = 1) -> FormulaPrediction:
    shape = ModelShape.from_hf_config(SMOLLM2_135M, name="smollm2")
    report = plan_capacity(shape, None, None, 256, 64, 0.25, kv_space_bytes=2 * 1024**3, block_size=128)
    notes = ("CPU: kv_cache_space_gib = 2",)
    return FormulaPrediction("smollm2", "ok", notes, report, replicas, report.admission_limit)


def run_with(stages: tuple[StageResult, ...], pred: FormulaPrediction | None) -> CalibrationRun:
    return CalibrationRun(
        name="test-run", model="smollm2", started_at="2025-01-01T00:00:00+00:00", workload=WORKLOAD, plan=PLAN,
        stages=stages, prediction=pred, seed=0, config_path="configs/local.yaml", environment=environment(),
        recommended_limit=4, recommendation="knee 4 of stage model", overlay_path="overlay.yaml",
    )  # fmt: skip


def test_report_directory_has_json_markdown_and_valid_pngs(tmp_path: Path) -> None:
    run = run_with((stage("model", routes=False), stage("gateway", routes=True)), prediction())
    paths = write_report(run, tmp_path / "out")
    assert set(paths) == {
        "results.json", "report.md", "throughput.png", "latency.png", "burst_gateway.png",
    }  # fmt: skip
    for name, path in paths.items():
        assert path.parent == tmp_path / "out" and path.stat().st_size > 0
        if name.endswith(".png"):
            assert path.read_bytes()[:8] == PNG_SIGNATURE

    data = json.loads(paths["results.json"].read_text())
    assert data["environment"]["cpu_count"] >= 1 and data["environment"]["python"]
    assert "spillover" in data["environment"]["packages"]
    assert data["workload"]["formula_prefix_share"] == pytest.approx(0.25)
    model, gateway = data["stages"]
    assert model["knee"]["concurrency"] == 4 and model["knee"]["bound"] == "latency"
    assert [p["concurrency"] for p in model["points"]] == [1, 2, 4, 8]
    assert len(model["levels"][0]["requests"]) == 8
    assert model["comparison"]["exceeds"] is True
    assert model["binding_bound"] == "compute/throughput"
    assert gateway["levels"][2]["summary"]["cloud_share"] == pytest.approx(2 / 7)  # i = 3, 6 (i = 0 is warm-up)
    assert data["prediction"]["report"]["kv_source"] == "kv_cache_space"
    assert data["recommendation"]["admission_limit"] == 4

    text = paths["report.md"].read_text()
    limit = prediction().admission_limit
    assert "**Knee: 4** (bound: latency)" in text
    assert f"formula's admission limit ({limit}), more than 15%" in text
    assert "compute/throughput-bound" in text
    assert "| model | 4 | " in text and "| compute/throughput |" in text
    assert "capacity_exceeded ×2" in text
    assert "kv bytes per token | 23,040 |" in text
    assert "![burst_gateway.png](burst_gateway.png)" in text
    assert "`admission_limit: 4` per replica" in text


def test_report_without_prediction_or_routes(tmp_path: Path) -> None:
    run = run_with((stage("gateway", routes=False),), None)
    paths = write_report(run, tmp_path)
    assert "burst_gateway.png" not in paths
    text = paths["report.md"].read_text()
    assert "No config was read: no prediction." in text
    assert "No comparison: the formula gave no admission limit." in text
    assert "| undetermined |" in text


def test_memory_binds_when_the_kv_limit_is_below_the_knee() -> None:
    pred = prediction()
    assert pred.report is not None
    small = replace(pred.report, predicted_max_concurrency=3, admission_limit=2)
    run = run_with((stage("model", routes=False),), FormulaPrediction("smollm2", "ok", (), small, 1, 2))
    assert run.bound(run.stages[0]) == "memory"
    assert "| memory |" in render_markdown(run)


def test_overlay_is_yaml_with_a_header_and_merges_into_a_config(tmp_path: Path) -> None:
    run = run_with((stage("model", routes=False),), prediction())
    path = write_overlay(tmp_path / "overlay.yaml", run, 4, report=tmp_path / "report.md")
    text = path.read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert "python -m bench calibrate" in header[0]
    assert any("knee 4 of stage model" in line for line in header)
    assert any(str(tmp_path / "report.md") in line for line in header)
    overlay = yaml.safe_load(text)
    assert overlay == {"models": [{"alias": "smollm2", "admission_limit": 4}]}
    config = yaml.safe_load(Path("configs/local.yaml").read_text())
    config["models"][0]["admission_limit"] = overlay["models"][0]["admission_limit"]
    assert parse_config(config, "merged").models[0].admission_limit == 4
