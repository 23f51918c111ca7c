"""`bench soak`: short runs (seconds) against a fake gateway (tests/unit/soak_fake_gateway.py) — in
process, stopped by SIGTERM, with bad input or nothing to reach, and end to end through
`python -m bench soak` with the real cloud simulator as a subprocess. The pure parts, the traffic's
answers and the fault episodes: tests/unit/test_bench_soak.py.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.cli import build_parser, main
from bench.cli_trust import default_concurrency
from bench.cloud_sim.process import running_cloud_sim
from bench.soak.load import FaultPlan
from bench.soak.metrics import MIB, ProcSample
from bench.soak.run import SoakError, SoakOptions, run_soak, run_soak_async
from tests.unit.soak_fake_gateway import MODEL, SIM_MODEL, FakeGateway, free_port, serving

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.realtime  # real sleeps and servers: scripts/test runs it at normal priority
def test_soak_end_to_end_through_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sim_port = free_port()
    with running_cloud_sim(sim_port, [SIM_MODEL], extra_args=["--ttft-s", "0.01", "--tokens-per-s", "1000"]) as sim:
        gateway = FakeGateway(cloud_url=sim.removesuffix("/v1"))
        with serving(gateway.app) as base:
            argv = ["soak", "--url", f"{base}/v1", "--model", MODEL, "--concurrency", "3", "--duration-s", "4",
                    "--sample-s", "0.5", "--window-s", "1", "--cloud-share", "0.3", "--sim", sim.removesuffix("/v1"),
                    "--faults", "error_5xx,rate_limit", "--fault-rate", "0.5", "--fault-every-s", "0.6",
                    "--fault-s", "0.4", "--probe-every-s", "0.3", "--drain-s", "10"]  # fmt: skip
            code = main([*argv, "--out", str(tmp_path / "soak")])
        faults_after = httpx.get(f"{sim.removesuffix('/v1')}/control/faults", timeout=5).json()
    out, err = capsys.readouterr()
    data = json.loads((tmp_path / "soak/results.json").read_text())
    totals = data["totals"]
    assert code == (0 if all(v["passed"] for v in data["verdicts"]) else 1)
    assert [v["name"] for v in data["verdicts"]] == ["growth", "p99", "lost", "wrong"]
    assert totals["requests"] > 10 and 0 < totals["streamed"] < totals["requests"]
    assert totals["cloud_pinned"] > 0 and totals["routed_cloud"] > 0
    pinned = [r for r in data["requests"] if r["share"] == "cloud"]
    assert {r["kind"] for r in pinned} == {"stream", "json"} and all(r["route"] == "cloud" for r in pinned)
    assert totals["lost"] == 0 and totals["wrong"] == 0 and totals["probes"] >= 3
    assert data["fault_episodes"] and all(e["error"] is None for e in data["fault_episodes"])
    assert faults_after["error_5xx_rate"] == 0 and faults_after["rate_limit_rate"] == 0  # restored
    sims = {s["pid"] for s in data["samples"] if s["role"] == "cloud-sim"}
    assert len(sims) == 1  # the simulator on --sim's port, sampled
    assert len(data["windows"]) == 4 and data["replicas"][0]["replicas"][0]["numerics"] == "ok"
    assert data["environment"]["engine"] == {"precision": "float32", "cpu_class": "avx2"}
    assert "local-sim" in gateway.residencies and "local_only" in gateway.residencies
    report = (tmp_path / "soak/report.md").read_text()
    assert "## Verdicts" in report and "growth after warm-up" in report and "cloud-sim [" in report
    for plot in ("soak_rss.png", "soak_fds.png", "soak_p99.png"):
        assert (tmp_path / "soak" / plot).read_bytes().startswith(PNG)
    assert err.count("[soak ") >= 8  # a progress line per sample
    assert "lost" in out and "report:" in out


def _in_process_options(tmp_path: Path, **kw: Any) -> SoakOptions:
    defaults: dict[str, Any] = {
        "url": "http://127.0.0.1:8000/v1", "model": MODEL, "concurrency": 2, "duration_s": 60.0, "sample_s": 0.2,
        "window_s": 0.5, "probe_every_s": 0.2, "drain_s": 5.0, "out_dir": str(tmp_path / "out"), "progress": False,
    }  # fmt: skip
    return SoakOptions(**{**defaults, **kw})


def test_sigterm_stops_the_run_and_the_report_so_far_is_written(tmp_path: Path) -> None:
    gateway = FakeGateway()
    calls: list[float] = []

    def sampler(t: float) -> list[ProcSample]:
        calls.append(t)
        if len(calls) == 6:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler is installed before the first sample
        return [ProcSample(t, "raylet", 1, 30 * MIB, 99)]

    outcome = run_soak(_in_process_options(tmp_path), sampler=sampler, transport=httpx.ASGITransport(gateway.app))
    run = outcome.run
    assert run.state.interrupted == "SIGTERM" and run.state.end_s < 60
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the soak's handler is gone again
    data = json.loads((tmp_path / "out/results.json").read_text())
    assert data["interrupted"] == "SIGTERM" and data["totals"]["requests"] > 0
    assert "stopped by SIGTERM" in (tmp_path / "out/report.md").read_text()
    assert outcome.exit_code == (0 if all(v.passed for v in run.verdicts) else 1)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"url": "http://10.1.2.3:8000/v1"}, "only to loopback"),
        ({"sim_url": "http://example.com:9100"}, "only to loopback"),
        ({"concurrency": 0}, "concurrency"),
        ({"duration_s": 0}, "duration_s"),
        ({"faults": FaultPlan(faults=("nope",))}, "faults must be"),
        ({"prompt": "fixed:x"}, "not a length distribution"),
    ],
)
async def test_bad_input_is_exit_2(tmp_path: Path, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(SoakError, match=message) as caught:
        await run_soak_async(_in_process_options(tmp_path, **kw), sampler=lambda t: [], install_signals=False)
    assert caught.value.exit_code == 2


async def test_an_unreachable_gateway_or_simulator_is_exit_1(tmp_path: Path) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(SoakError, match="cannot reach") as caught:
        await run_soak_async(_in_process_options(tmp_path), sampler=lambda t: [], transport=httpx.MockTransport(refuse),
                             install_signals=False)  # fmt: skip
    assert caught.value.exit_code == 1
    gateway = FakeGateway()
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(SoakError, match="control API") as caught:
        await run_soak_async(_in_process_options(tmp_path, sim_url=closed), sampler=lambda t: [],
                             transport=httpx.ASGITransport(gateway.app), install_signals=False)  # fmt: skip
    assert caught.value.exit_code == 1


def test_the_default_concurrency_is_the_configured_admission_limit(tmp_path: Path) -> None:
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(f"models:\n  - alias: {MODEL}\n    admission_limit: 4\n")
    limit, source = default_concurrency("configs/local.yaml", [str(overlay)], MODEL)
    assert limit == 4 and "admission_limit 4 × 1 replica" in source
    with pytest.raises(SoakError, match="admission_limit") as caught:
        default_concurrency("configs/local.yaml", [], MODEL)
    assert caught.value.exit_code == 2
    args = build_parser().parse_args(["soak", "--url", "http://127.0.0.1:8000/v1", "--model", MODEL])
    assert (args.duration_s, args.sample_s, args.window_s, args.concurrency) == (1800.0, 30.0, 300.0, None)
    assert main(["soak", "--url", "http://127.0.0.1:8000/v1", "--model", MODEL, "--config", "configs/local.yaml"]) == 2
