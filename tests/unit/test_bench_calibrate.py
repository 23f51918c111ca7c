"""bench.calibrate.run / bench.cli / bench.calibrate.formula in process: the cloud simulator through
httpx.ASGITransport, bad inputs, unreachable URLs, and the formula prediction from a config."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import random
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.calibrate.formula import predict
from bench.calibrate.run import CalibrateOptions, CalibrationError, calibrate, summary_lines
from bench.cli import add_bench_parser, main
from bench.cloud_sim import SimSettings, build_app
from bench.load.workload import LengthDist, WorkloadSpec
from cluster.capacity.model_shape import QWEN2_5_7B, SMOLLM2_135M
from cluster.config.deployment import parse_config
from cluster.hardware.nvml import PynvmlReader
from cluster.hardware.nvml_fake import GIB, NVML_ERROR_LIBRARY_NOT_FOUND, FakeGpu, FakeNvml

MODEL = "smollm2-135m-instruct"


def sim_transport(**settings: Any) -> httpx.ASGITransport:
    base = {"models": (MODEL,), "ttft_s": 0.02, "tokens_per_s": 400.0, "max_concurrency": 3}
    app = build_app(SimSettings(**{**base, **settings}), rng=random.Random(0), sleep=asyncio.sleep)
    return httpx.ASGITransport(app=app, raise_app_exceptions=False)


def write_config(tmp_path: Path, **model: Any) -> Path:
    folder = tmp_path / "smollm2"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(SMOLLM2_135M)))
    spec = {"alias": MODEL, "source": str(folder), "family": "llama", "engine_args": {"dtype": "float32"}, **model}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "models": [spec]}))
    return path


def options(tmp_path: Path, **kw: Any) -> CalibrateOptions:
    base: dict[str, Any] = {
        "url": "http://gateway/v1", "model": MODEL, "concurrency": (1, 2, 3, 6), "requests_per_level": 6,
        "warmup": 1, "prompt": "fixed:12", "output": "fixed:4", "prefix_share": 0.5, "slo_p95_s": 2.0,
        "out_dir": str(tmp_path / "out"), "progress": False,
    }  # fmt: skip
    return CalibrateOptions(**{**base, **kw})


@pytest.mark.realtime  # real sleeps and servers: scripts/test runs it at normal priority
def test_calibrate_in_process_finds_the_simulators_capacity(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    transport = sim_transport()
    outcome = calibrate(
        options(tmp_path, direct_url="http://model/v1", config_path=str(config)),
        transport_for=lambda url: transport,
        now=lambda: datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
    )
    run = outcome.run
    assert [s.name for s in run.stages] == ["model", "gateway"]
    for stage in run.stages:
        assert stage.knee.concurrency == 3, stage.knee.explanation
        assert stage.knee.bound == "errors"
    assert run.recommended_limit == 3 and outcome.exit_code == 0
    assert run.prediction is not None and run.prediction.report is not None
    assert run.prediction.report.kv_bytes_per_token == 46_080  # SmolLM2 in float32
    assert run.bound(run.stages[0]) == "compute/throughput"
    assert outcome.overlay_path == tmp_path / "out" / "overlay.yaml"
    assert yaml.safe_load(outcome.overlay_path.read_text())["models"] == [{"alias": MODEL, "admission_limit": 3}]
    assert run.started_at == "2025-01-02T03:04:05+00:00"
    text = "\n".join(summary_lines(outcome))
    assert "stage model (http://model/v1): knee 3 [bound: errors]" in text
    assert "recommended admission_limit: 3 per replica" in text


def test_knee_divided_by_replicas_for_the_overlay(tmp_path: Path) -> None:
    config = write_config(tmp_path, replicas=2)
    outcome = calibrate(
        options(tmp_path, concurrency=(1, 3), config_path=str(config), overlay_out=str(tmp_path / "o.yaml")),
        transport_for=lambda url: sim_transport(),
    )
    assert outcome.run.stages[0].knee.concurrency == 3
    assert outcome.run.recommended_limit == 1  # ⌊3 / 2 replicas⌋
    assert "÷ 2 replicas" in outcome.run.recommendation
    assert (tmp_path / "o.yaml").is_file()


def test_no_knee_means_no_overlay_and_exit_1(tmp_path: Path) -> None:
    outcome = calibrate(
        options(tmp_path, concurrency=(1, 2)), transport_for=lambda url: sim_transport(error_5xx_rate=1.0)
    )
    assert outcome.run.recommended_limit is None and outcome.overlay_path is None
    assert outcome.exit_code == 1
    assert (tmp_path / "out" / "report.md").is_file()
    assert not (tmp_path / "out" / "overlay.yaml").exists()


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"prompt": "big"}, "not a length distribution"),
        ({"concurrency": (4, 2)}, "increasing"),
        ({"url": "localhost:8000"}, "not an http(s) base URL"),
        ({"gpu_mem": "lots", "config_path": "configs/gpu.yaml"}, "--gpu-mem"),
        ({"config_path": "/nonexistent/config.yaml"}, "/nonexistent/config.yaml"),
        ({"api_key_env": "SPILLOVER_TEST_UNSET_KEY"}, "SPILLOVER_TEST_UNSET_KEY is not set"),
    ],
)
def test_bad_inputs_are_exit_2(tmp_path: Path, kw: dict[str, Any], says: str) -> None:
    with pytest.raises(CalibrationError) as info:
        calibrate(options(tmp_path, **kw), transport_for=lambda url: sim_transport())
    assert info.value.exit_code == 2
    assert says in info.value.message


def test_unreachable_url_and_unknown_model(tmp_path: Path) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("All connection attempts failed", request=request)

    with pytest.raises(CalibrationError) as info:
        calibrate(options(tmp_path), transport_for=lambda url: httpx.MockTransport(refuse))
    assert info.value.exit_code == 1
    assert "cannot reach http://gateway/v1" in info.value.message
    with pytest.raises(CalibrationError) as info:
        calibrate(options(tmp_path, model="other"), transport_for=lambda url: sim_transport())
    assert info.value.exit_code == 2
    assert f"does not serve model 'other'; it serves: {MODEL}" in info.value.message
    with pytest.raises(CalibrationError) as info:
        calibrate(options(tmp_path), transport_for=lambda url: sim_transport(api_key="sekret"))
    assert info.value.exit_code == 2
    assert "missing_api_key" in info.value.message and "--api-key-env" in info.value.message


def test_api_key_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPILLOVER_TEST_SIM_KEY", "sekret")
    transport = sim_transport(api_key="sekret")
    outcome = calibrate(
        options(tmp_path, concurrency=(1,), api_key_env="SPILLOVER_TEST_SIM_KEY"), transport_for=lambda url: transport
    )
    assert outcome.run.stages[0].levels[0].summary.ok == 6


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_cli_errors_are_one_line_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    argv = ["calibrate", "--url", url, "--model", MODEL, "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot reach {url}") and "Traceback" not in err
    for bad in (["--concurrency", "1,x"], ["--concurrency", "4,2"], ["--prefix-share", "2"], ["--slo-p95-s", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, *bad])
        assert exit_info.value.code == 2
    assert "--concurrency" in capsys.readouterr().err


def test_add_bench_parser_registers_bench_calibrate() -> None:
    parser = argparse.ArgumentParser(prog="spillover")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", "calibrate", "--url", "http://h/v1", "--model", "m", "--concurrency", "2,4"])
    assert args.concurrency == (2, 4) and args.requests_per_level == 20 and args.config is None
    assert callable(args.func)


def test_prediction_follows_spillover_capacity(tmp_path: Path) -> None:
    workload = WorkloadSpec(LengthDist.parse("fixed:256"), LengthDist.parse("fixed:64"))
    config = parse_config(yaml.safe_load(write_config(tmp_path).read_text()), "test")
    cpu = predict(config, MODEL, workload)
    assert cpu.report is not None and cpu.report.kv_source == "kv_cache_space"
    # 2 GiB / (46,080 B × 128) = 364 blocks × 128 = 46,592 tokens; / (256 + 64) = 145; × 0.8 = 116
    assert (cpu.report.predicted_max_concurrency, cpu.admission_limit) == (145, 116)
    assert predict(config, "nope", workload).status == "not_in_config"

    gpu_config = parse_config(
        {"models": [{"alias": "qwen", "source": "Qwen/Qwen2.5-7B-Instruct", "family": "qwen", "accelerator": "gpu"}]},
        "gpu",
    )
    missing = FakeNvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
    no_gpu = predict(gpu_config, "qwen", workload, gpu_reader=lambda: PynvmlReader(nvml_module=missing))
    assert no_gpu.status == "no_gpu" and no_gpu.report is None
    fake = FakeNvml(gpus=[FakeGpu(uuid="GPU-0", name="H100", memory_total=80 * GIB)])
    h100 = predict(gpu_config, "qwen", workload, gpu_reader=lambda: PynvmlReader(nvml_module=fake))
    assert h100.report is not None and h100.report.kv_bytes_per_token == 57_344
    assert any("NVML" in note for note in h100.notes)
    given = predict(gpu_config, "qwen", workload, gpu_mem=80 * GIB)
    assert given.report is not None and given.report.predicted_max_concurrency == h100.report.predicted_max_concurrency
    assert QWEN2_5_7B["num_key_value_heads"] == 4  # the shape the built-in hub id maps to


def test_stdout_summary_of_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    transport = sim_transport()
    monkeypatch.setattr("bench.cli.calibrate", lambda opts: calibrate(opts, transport_for=lambda url: transport))
    config = write_config(tmp_path)
    code = main(["calibrate", "--url", "http://gw/v1", "--model", MODEL, "--concurrency", "1,3,6",
                 "--requests-per-level", "6", "--warmup", "1", "--prompt", "fixed:12", "--output", "fixed:4",
                 "--config", str(config), "--out", str(tmp_path / "o"), "--no-progress"])  # fmt: skip
    assert code == 0
    assert "knee 3 [bound: errors]" in out.getvalue()
