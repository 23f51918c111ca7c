"""bench/calibrate/fit.py and its flags: shapes, held-out levels, fit points from measured levels, the perf
overlay (synthetic requests from known parameters), and bad inputs refused with exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.calibrate.fit import ComputeOutcome, fit_outcome, parse_shapes, perf_overlay, shape_workload
from bench.calibrate.knee import find_knee
from bench.calibrate.run import CalibrationError, calibrate
from bench.calibrate.sweep import LevelResult, StageResult, SweepPlan
from bench.cli import main
from bench.load.request_result import RequestResult
from bench.load.stats import summarize
from bench.load.workload import WorkloadError
from cluster.capacity.compute_knee import compute_knee
from cluster.capacity.compute_model import PerfParams, Workload
from cluster.capacity.engine_sim import EngineLimits, Protocol, simulate
from cluster.config.perf import PerfSection
from tests.unit.test_bench_calibrate import MODEL, options, sim_transport

TRUE = PerfParams(0.3, 0.075, 0.0085, 0.0021)
TEMPLATE = 20  # prompt tokens the (pretend) chat template adds to the words sent


def test_parse_shapes() -> None:
    assert parse_shapes(" 600x8, 50x32 ") == ("600x8", "50x32")
    w = shape_workload("600x8")
    assert (w.prompt.mean, w.output.mean, w.prefix_share) == (600, 8, 0.0)
    for bad in ("", "600", "0x8", "600x0", "axb", "600x8,600x8"):
        with pytest.raises(WorkloadError):
            parse_shapes(bad)


def stage(shape: str, levels: tuple[int, ...], slo: float = 10.0) -> StageResult:
    """A measured stage whose requests take exactly what the engine simulation with TRUE gives."""
    workload = shape_workload(shape)
    prompt, output = workload.prompt.mean + TEMPLATE, int(workload.output.mean)
    plan = SweepPlan(levels, 4, warmup=0, slo_p95_s=slo)
    done = []
    for n in levels:
        run = simulate(TRUE, Workload(prompt, output), EngineLimits(), n, 4)
        results = tuple(
            RequestResult(i, 0.0, e2e, ttft, output, int(prompt), 0)
            for i, (e2e, ttft) in enumerate(zip(run.e2e_s, run.ttft_s, strict=True))
        )
        done.append(LevelResult(n, summarize(results), results))
    knee = find_knee([lv.point("e2e") for lv in done], slo)
    return StageResult(f"fit {shape}", "http://g/v1", MODEL, plan, tuple(done), knee)


def test_fit_from_measured_levels_recovers_the_parameters_and_writes_perf() -> None:
    fits = [(stage(s, (1, 2, 4)), shape_workload(s)) for s in ("600x8", "50x32")]
    main_stage = stage("280x64", (1, 2, 3, 4, 5))
    outcome = fit_outcome(fits, (main_stage, shape_workload("280x64")), main_stage.plan)
    got = outcome.fit.params
    assert got.step_s == pytest.approx(TRUE.step_s, rel=0.05)
    assert got.per_prefill_token_s == pytest.approx(TRUE.per_prefill_token_s, rel=0.05)
    assert outcome.fit.rms_relative_error < 0.01
    assert outcome.template_tokens == pytest.approx(TEMPLATE)
    assert outcome.highest_level == 5
    assert outcome.knee_for(300, 64) == compute_knee(TRUE, Workload(300, 64), slo_e2e_p95_s=10).concurrency
    perf = PerfSection.model_validate(perf_overlay(outcome, main_stage, "test"))
    assert perf.slo_e2e_p95_s == 10
    assert perf.knees[0].predicted == outcome.knee_for(300, 64, protocol=Protocol(4, 0))
    assert perf.knees[0].knee == main_stage.knee.concurrency
    assert isinstance(outcome, ComputeOutcome) and outcome.to_dict()["fit"]["params"]["step_s"] == got.step_s


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"fit_shapes": "300"}, "not a shape"),
        ({"holdout_shapes": "100x8"}, "needs --fit-shapes"),
        ({"fit_shapes": "10x2", "holdout_shapes": "10x2"}, "must not also be a fit shape"),
        ({"fit_shapes": "10x2", "fit_concurrency": (2, 1)}, "increasing"),
        ({"fit_shapes": "10x2", "fit_requests_per_level": 0}, "requests per level"),
    ],
)
def test_bad_fit_inputs_are_exit_2(tmp_path: Path, kw: dict[str, Any], says: str) -> None:
    with pytest.raises(CalibrationError) as info:
        calibrate(options(tmp_path, **kw), transport_for=lambda url: sim_transport())
    assert info.value.exit_code == 2 and says in info.value.message


def test_bad_fit_flags_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["calibrate", "--url", "http://127.0.0.1:9/v1", "--model", MODEL]
    for bad in (["--fit-shapes", "600"], ["--holdout-shapes", "1x1,1x1"], ["--fit-concurrency", "0"],
                ["--fit-requests-per-level", "-1"], ["--holdout-requests-per-level", "x"],
                ["--waves", "-1"]):  # fmt: skip
        with pytest.raises(SystemExit) as info:
            main([*argv, *bad])
        assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--fit-shapes" in err and "Traceback" not in err


def test_a_fit_that_cannot_be_made_is_reported_with_exit_1(tmp_path: Path) -> None:
    # the simulator's latency does not grow with concurrency: no compute bound to fit
    outcome = calibrate(
        options(tmp_path, concurrency=(1, 2), fit_shapes="20x4,40x2", fit_concurrency=(1, 2), fit_requests_per_level=2),
        transport_for=lambda url: sim_transport(max_concurrency=8),
    )
    if outcome.run.compute is None:
        assert outcome.exit_code == 1 and outcome.run.compute_error
        assert "The fit failed" in (tmp_path / "out" / "report.md").read_text()
    else:  # timing noise can look like growth: then the parameters are at least usable
        assert "## Compute model" in (tmp_path / "out" / "report.md").read_text()


def test_waves_run_at_least_w_rounds_of_n_requests(tmp_path: Path) -> None:
    outcome = calibrate(
        options(tmp_path, concurrency=(1, 3), requests_per_level=2, waves=2),
        transport_for=lambda url: sim_transport(),
    )
    (stage_done,) = outcome.run.stages
    assert [lv.summary.count for lv in stage_done.levels] == [2, 6]  # max(2, 2 × N)
    assert SweepPlan((1, 3), 2, waves=2).requests_at(3) == 6
    assert "max(2, 2 × N) measured requests per level" in (tmp_path / "out" / "report.md").read_text()
    with pytest.raises(ValueError, match="waves"):
        SweepPlan((1,), 2, waves=-1)


async def test_the_fit_says_the_cpu_class_and_precision_it_was_measured_with(tmp_path: Path) -> None:
    """The gateway never applies a fit to a replica of another CPU class or precision: the overlay carries
    the replica's own, read from the gateway's cluster view (its cpu_class and precision fields)."""
    import dataclasses

    import httpx
    import yaml

    from bench.calibrate.run import engine_of, write_overlay
    from tests.unit.test_bench_report import prediction, run_with

    view = {"replicas": [{"model": MODEL, "precision": "float32 eager", "cpu_class": "avx2", "stale": False}]}
    ok = httpx.AsyncClient(
        base_url="http://gw/v1/", transport=httpx.MockTransport(lambda r: httpx.Response(200, json=view))
    )
    assert await engine_of(ok, MODEL) == {"precision": "float32 eager", "cpu_class": "avx2"}
    refused = httpx.MockTransport(lambda r: httpx.Response(403, json={"error": {"code": "forbidden"}}))
    assert await engine_of(httpx.AsyncClient(base_url="http://gw/v1/", transport=refused), MODEL) is None

    fits = [(stage(s, (1, 2, 4)), shape_workload(s)) for s in ("600x8", "50x32")]
    main_stage = stage("280x64", (1, 2, 3, 4, 5))
    outcome = fit_outcome(fits, (main_stage, shape_workload("280x64")), main_stage.plan)
    run = dataclasses.replace(run_with((main_stage,), prediction()), compute=outcome)
    run = dataclasses.replace(
        run, environment={**run.environment, "engine": {"precision": "float32 eager", "cpu_class": "avx2"}}
    )
    perf = yaml.safe_load(write_overlay(tmp_path / "overlay.yaml", run, 4).read_text())["models"][0]["perf"]
    assert (perf["cpu"], perf["precision"]) == ("avx2", "float32 eager")
    assert PerfSection.model_validate(perf).mismatch("amx-bf16", "float32 eager") is not None
