"""A short `bench calibrate` against the real CPU stack: the JSON, the report, the plots, and the
compute model's fit path (two small fit shapes at concurrency 1 and 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bench.calibrate.run import CalibrateOptions, calibrate
from cluster.config.perf import PerfSection
from tests.integration.conftest import REPO, Stack

pytestmark = pytest.mark.integration


def test_calibrate_smoke(stack: Stack, tmp_path: Path) -> None:
    out = calibrate(
        CalibrateOptions(
            url=stack.openai_base,
            model="smollm2-135m-instruct",
            concurrency=(1, 2),
            requests_per_level=3,
            warmup=1,
            prompt="fixed:32",
            output="fixed:8",
            slo_p95_s=60,
            config_path=str(REPO / "configs/local.yaml"),
            out_dir=str(tmp_path / "calib"),
            progress=False,
            fit_shapes="48x2,8x8",
            fit_concurrency=(1, 2),
            fit_requests_per_level=2,
        )
    )
    stage = out.run.stages[-1]
    assert [level.summary.ok for level in stage.levels] == [3, 3]
    report = tmp_path / "calib"
    results = json.loads((report / "results.json").read_text())
    assert results["stages"][-1]["levels"][0]["summary"]["ok"] == 3
    assert "Knee" in (report / "report.md").read_text() or "knee" in (report / "report.md").read_text()
    for png in ("throughput.png", "latency.png"):
        assert (report / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    overlay = yaml.safe_load(out.overlay_path.read_text())  # type: ignore[union-attr]
    assert overlay["models"][0]["alias"] == "smollm2-135m-instruct"
    assert overlay["models"][0]["admission_limit"] >= 1
    # the fit path: both fit shapes ran at both levels; the fit either gave parameters that load as
    # models[].perf (the usual case: latency grows with concurrency) or said why it could not
    fitted = results["compute"]
    if fitted is None:
        assert results["compute_error"], "a fit was asked for: it must give parameters or a reason"
        return
    assert [[lv["summary"]["ok"] for lv in s["levels"]] for s in fitted["fit_stages"]] == [[2, 2], [2, 2]]
    perf = PerfSection.model_validate(overlay["models"][0]["perf"])
    assert perf.slo_e2e_p95_s == 60 and perf.knees[0].knee == stage.knee.concurrency
    assert "## Compute model" in (report / "report.md").read_text()
