"""`bench overload`: the metrics on synthetic results, the run against a scripted gateway
(httpx.MockTransport: route headers, 429 local_capacity_exhausted, the headers of each mode), the
command line, and end to end `python -m bench overload` against a real cloud-sim subprocess."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.cli import add_bench_parser, main, overload_options_from_args
from bench.cloud_sim.process import running_cloud_sim
from bench.load.request_result import CANCELLED, RequestResult
from bench.load.workload import LengthDist, WorkloadSpec
from bench.overload.metrics import (
    OverloadLevel,
    OverloadRun,
    cloud_cost_usd,
    cloud_share,
    measure_level,
    min_cloud_share,
    route_counts,
    slo_attainment,
)
from bench.overload.report import compare_cloud_share, render_markdown
from bench.overload.run import OverloadError, OverloadOptions, check_options, mode_headers, run_overload

REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOTS = ("overload_p95.png", "overload_slo.png", "overload_cloud.png")


def res(i: int, e2e: float, *, error: str | None = None, route: str | None = None, **kw: Any) -> RequestResult:
    return RequestResult(i, start_s=float(i), e2e_s=e2e, error=error, route=route, **kw)


# -- the formula and the metrics ---------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "knee", "share"),
    [(0.23, 0.46, 0.0), (0.46, 0.46, 0.0), (0.69, 0.46, 1 / 3), (0.92, 0.46, 0.5), (1.38, 0.46, 2 / 3), (10, 1, 0.9)],
)
def test_minimal_cloud_share_is_the_excess_over_the_knee(rate: float, knee: float, share: float) -> None:
    assert min_cloud_share(rate, knee) == pytest.approx(share)


def test_minimal_cloud_share_needs_positive_rates() -> None:
    for rate, knee in ((0, 1), (1, 0), (-1, 1)):
        with pytest.raises(ValueError, match="must be > 0"):
            min_cloud_share(rate, knee)


def test_slo_attainment_counts_every_offered_request() -> None:
    results = [
        res(0, 1.0),  # in the SLO
        res(1, 2.0),  # exactly at the SLO: counts
        res(2, 2.5),  # answered, too late
        res(3, 0.1, error="local_capacity_exhausted"),  # fast, but an error
        res(4, 9.0, error=CANCELLED),  # cut by the level's time limit
        res(5, 0.5, warmup=True),  # not offered
    ]
    assert slo_attainment(results, 2.0) == pytest.approx(2 / 5)
    assert slo_attainment(results, 3.0) == pytest.approx(3 / 5)
    assert slo_attainment([], 2.0) is None
    assert slo_attainment([res(0, 0.1, warmup=True)], 2.0) is None


def test_routes_and_cloud_share_survive_a_missing_header() -> None:
    results = [
        res(0, 1, route="cloud"),
        res(1, 1, route="local"),
        res(2, 1, route="Cloud "),
        res(3, 1),  # no header: unknown
        res(4, 1, route="elsewhere"),  # unrecognised: unknown
        res(5, 1, route="cloud", error="upstream_error"),  # not answered: not counted
    ]
    assert route_counts(results) == {"local": 1, "cloud": 2, "unknown": 2}
    assert cloud_share(results) == pytest.approx(2 / 5)
    assert cloud_share([res(0, 1), res(1, 1)]) == 0.0  # a plain OpenAI server: 0, not None
    assert cloud_share([res(0, 1, error="x")]) is None


def test_cloud_cost_from_usage_and_prices() -> None:
    results = [
        res(0, 1, route="cloud", prompt_tokens=1_000_000, output_tokens=500_000),
        res(1, 1, route="cloud", prompt_tokens=200, output_tokens=64),
        res(2, 1, route="cloud", output_tokens=64),  # no usage: counted, not priced
        res(3, 1, route="local", prompt_tokens=10**6, output_tokens=10**6),  # local costs nothing here
    ]
    cost, unpriced = cloud_cost_usd(results, 0.15, 0.60)
    assert cost == pytest.approx(0.15 + 0.30 + (200 * 0.15 + 64 * 0.60) / 1e6)
    assert unpriced == 1


def test_measure_level_on_synthetic_results() -> None:
    results = [
        res(0, 1.0, route="local", prompt_tokens=200, output_tokens=64),
        res(1, 3.0, route="local"),
        res(2, 1.5, route="cloud", prompt_tokens=200, output_tokens=64),
        res(3, 0.2, error="local_capacity_exhausted", route="local"),
        res(4, 0.2, error="local_capacity_exhausted"),
        res(5, 12.0, error=CANCELLED),
    ]
    m = measure_level(results, rate_rps=0.92, knee_rps=0.46, slo_s=2.0, duration_s=10.0)
    assert (m.offered, m.ok, m.errors, m.cancelled, m.in_slo) == (6, 3, 2, 1, 2)
    assert m.offered_rate_rps == pytest.approx(0.6) and m.goodput_rps == pytest.approx(0.2)
    assert m.error_codes == {"local_capacity_exhausted": 2}
    assert m.slo_attainment == pytest.approx(2 / 6)
    assert m.e2e_p50_s == pytest.approx(1.5) and m.e2e_p95_s == pytest.approx(2.85)
    assert m.routes == {"local": 2, "cloud": 1, "unknown": 0}
    assert m.cloud_share == pytest.approx(1 / 3) and m.min_cloud_share == pytest.approx(0.5)
    assert m.cost_usd == pytest.approx((200 * 0.15 + 64 * 0.60) / 1e6) and m.unpriced_cloud == 0


def test_mode_headers() -> None:
    assert mode_headers("burst", 5000) == {}
    assert mode_headers("local_only") == {"x-spillover-residency": "local_only"}
    assert mode_headers("local_only", 10_000) == {
        "x-spillover-residency": "local_only",
        "x-spillover-deadline-ms": "10000",
    }
    with pytest.raises(ValueError, match="unknown mode"):
        mode_headers("cloud_only")


# -- a scripted gateway --------------------------------------------------------------------


def scripted_gateway(seen: list[dict[str, str]]) -> httpx.MockTransport:
    """Burst: every other answer from the cloud. local_only: every third request 429s."""
    numbers = count()

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        seen.append(dict(request.headers))
        n = next(numbers)
        local_only = request.headers.get("x-spillover-residency") == "local_only"
        if local_only and n % 3 == 2:
            body = {"error": {"message": "no local room", "code": "local_capacity_exhausted"}}
            return httpx.Response(429, json=body, headers={"x-spillover-route": "local"})
        route = "local" if local_only or n % 2 else "cloud"
        usage = {"prompt_tokens": 100, "completion_tokens": 10}
        chunks = [{"choices": [{"delta": {"content": "hi"}}]}, {"choices": [], "usage": usage}]
        sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, content=sse.encode(), headers={"x-spillover-route": route})

    return httpx.MockTransport(handle)


def overload_options(tmp_path: Path, **kw: Any) -> OverloadOptions:
    base: dict[str, Any] = {
        "url": "http://gateway/v1",
        "model": "m",
        "knee_rps": 20.0,
        "multiples": (0.5, 2.0),
        "duration_s": 0.4,
        "prompt": "fixed:8",
        "output": "fixed:4",
        "slo_p95_s": 1.0,
        "deadline_ms": 1000,
        "cooldown_s": 0.0,
        "out_dir": str(tmp_path / "run"),
        "progress": False,
        "seed": 7,
    }
    return OverloadOptions(**{**base, **kw})


@pytest.mark.realtime  # arrivals on the wall clock (start_s within 0.25 s): scripts/test runs it at normal priority
def test_run_against_a_scripted_gateway(tmp_path: Path) -> None:
    seen: list[dict[str, str]] = []
    outcome = run_overload(overload_options(tmp_path), transport=scripted_gateway(seen))
    run = outcome.run
    assert outcome.exit_code == 0
    assert [(lv.mode, lv.multiple) for lv in run.levels] == [
        ("burst", 0.5),
        ("burst", 2.0),
        ("local_only", 0.5),
        ("local_only", 2.0),
    ]
    burst, local = run.of("burst"), run.of("local_only")
    for b, lo in zip(burst, local, strict=True):
        assert b.metrics.offered == lo.metrics.offered == len(b.results) >= 1  # the same arrivals per multiple
        assert [r.start_s for r in b.results] == pytest.approx([r.start_s for r in lo.results], abs=0.25)
    total_burst = sum(lv.metrics.offered for lv in burst)
    assert all("x-spillover-residency" not in h for h in seen[:total_burst])
    assert all(h["x-spillover-residency"] == "local_only" for h in seen[total_burst:])
    assert all(h["x-spillover-deadline-ms"] == "1000" for h in seen[total_burst:])
    assert sum(lv.metrics.routes["cloud"] for lv in burst) >= 1
    assert all(lv.metrics.routes["cloud"] == 0 for lv in local)
    assert sum(lv.metrics.error_codes.get("local_capacity_exhausted", 0) for lv in local) >= 1
    cloud_answers = sum(lv.metrics.routes["cloud"] for lv in burst)
    assert sum(lv.metrics.cost_usd for lv in burst) == pytest.approx(cloud_answers * (100 * 0.15 + 10 * 0.6) / 1e6)

    data = json.loads((tmp_path / "run" / "results.json").read_text())
    assert data["knee_rps"] == 20.0 and data["deadline_ms"] == 1000 and len(data["levels"]) == 4
    assert data["levels"][1]["metrics"]["min_cloud_share"] == pytest.approx(0.5)
    report = (tmp_path / "run" / "report.md").read_text()
    for text in ("## Mode `burst`", "## Mode `local_only`", "## Burst vs local_only", "points, ", "stayed local"):
        assert text in report
    for name in PLOTS:
        assert (tmp_path / "run" / name).read_bytes()[:8] == PNG_SIGNATURE


def test_report_wording_with_one_mode_and_a_leak() -> None:
    ok = [res(0, 1, route="cloud", prompt_tokens=5, output_tokens=5)]
    level = measure_level(ok, rate_rps=2, knee_rps=1, slo_s=2, duration_s=1)
    workload = WorkloadSpec(LengthDist.parse("fixed:4"), LengthDist.parse("fixed:4"))
    run = OverloadRun(
        name="r", model="m", url="http://g/v1", started_at="t", knee_rps=1, multiples=(2,), modes=("local_only",),
        duration_s=1, drain_s=4, slo_s=2, workload=workload, seed=0,
        levels=(OverloadLevel("local_only", 2, 2, level, tuple(ok)),),
    )  # fmt: skip
    text = render_markdown(run, ["overload_p95.png"])
    assert "Only mode `local_only` was run" in text and "![overload_p95.png](overload_p95.png)" in text
    assert any("residency was broken" in line for line in compare_cloud_share(run))


def test_bad_inputs_and_unreachable_url(tmp_path: Path) -> None:
    for kw, says in (
        ({"knee_rps": 0}, "knee"),
        ({"multiples": (1, 1)}, "repeat"),
        ({"modes": ("burst", "cloud")}, "modes"),
        ({"prompt": "fixed:x"}, "length distribution"),
        ({"deadline_ms": 0}, "deadline"),
    ):
        with pytest.raises(OverloadError) as info:
            check_options(overload_options(tmp_path, **kw))
        assert info.value.exit_code == 2 and says in info.value.message

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("All connection attempts failed", request=request)

    with pytest.raises(OverloadError) as info:
        run_overload(overload_options(tmp_path), transport=httpx.MockTransport(refuse))
    assert info.value.exit_code == 1 and "cannot reach http://gateway/v1" in info.value.message
    with pytest.raises(OverloadError) as info:
        run_overload(overload_options(tmp_path, model="other"), transport=scripted_gateway([]))
    assert info.value.exit_code == 2 and "does not serve model 'other'" in info.value.message


# -- the command line ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_cli_flags_and_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="spillover")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    argv = ["bench", "overload", "--url", "http://h/v1", "--model", "m", "--knee-rps", "0.46"]
    args = parser.parse_args([*argv, "--deadline-ms", "slo", "--slo-p95-s", "8", "--modes", "local_only"])
    opts = overload_options_from_args(args)
    assert opts.multiples == (0.5, 1.0, 1.5, 2.0, 3.0) and opts.duration_s == 30 and opts.modes == ("local_only",)
    assert opts.deadline_ms == 8000 and opts.drain == 16 and (opts.price_in, opts.price_out) == (0.15, 0.60)
    assert (opts.prompt, opts.output) == ("fixed:200", "fixed:64") and callable(args.func)

    url = f"http://127.0.0.1:{free_port()}/v1"
    base = ["overload", "--url", url, "--model", "m", "--knee-rps", "1", "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot reach {url}") and "Traceback" not in err
    for bad in (["--multiples", "0,1"], ["--multiples", "1,x"], ["--modes", "burst,cloud"], ["--knee-rps", "0"],
                ["--deadline-ms", "soon"], ["--duration-s", "-1"]):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            main([*base, *bad])
        assert exit_info.value.code == 2
    assert main([*base, "--prompt", "fixed:zero"]) == 2
    assert "not a length distribution" in capsys.readouterr().err


# -- end to end: a real cloud-sim as the "gateway" -------------------------------------------


@pytest.mark.realtime  # real sleeps and servers: scripts/test runs it at normal priority
def test_overload_against_a_real_cloud_sim(tmp_path: Path) -> None:
    out = tmp_path / "run"
    sim_flags = ["--ttft-s", "0.02", "--tokens-per-s", "400"]
    with running_cloud_sim(free_port(), ["sim-smollm2"], extra_args=sim_flags) as url:
        command = [
            sys.executable, "-m", "bench", "overload", "--url", url, "--model", "sim-smollm2", "--knee-rps", "4",
            "--multiples", "0.5,2", "--duration-s", "2", "--prompt", "fixed:16", "--output", "fixed:8",
            "--slo-p95-s", "2", "--deadline-ms", "slo", "--drain-s", "3", "--cooldown-s", "0",
            "--out", str(out), "--no-progress", "--seed", "1",
        ]  # fmt: skip
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "no answer carried x-spillover-route" in done.stdout

    data = json.loads((out / "results.json").read_text())
    levels = data["levels"]
    assert [(lv["mode"], lv["multiple"]) for lv in levels] == [
        ("burst", 0.5),
        ("burst", 2.0),
        ("local_only", 0.5),
        ("local_only", 2.0),
    ]
    for lv in levels:
        m = lv["metrics"]
        expected = lv["rate_rps"] * 2  # λ × duration
        assert m["offered"] == len(lv["requests"]) and 1 <= m["offered"] <= 3 * expected + 5
        assert m["ok"] + m["errors"] + m["cancelled"] == m["offered"]
        assert m["ok"] == m["offered"] and m["slo_attainment"] == 1.0
        assert m["routes"]["unknown"] == m["ok"] and m["cloud_share"] == 0.0 and m["cost_usd"] == 0.0
        assert all(r["output_tokens"] == 8 and r["prompt_tokens"] == 16 for r in lv["requests"])
    assert levels[0]["metrics"]["offered"] == levels[2]["metrics"]["offered"]  # the same arrivals per multiple
    assert levels[1]["metrics"]["offered"] == levels[3]["metrics"]["offered"]
    assert levels[1]["metrics"]["offered"] > levels[0]["metrics"]["offered"]
    assert levels[1]["metrics"]["min_cloud_share"] == 0.5 and levels[0]["metrics"]["min_cloud_share"] == 0.0
    assert data["deadline_ms"] == 2000

    report = (out / "report.md").read_text()
    assert "## Mode `burst`" in report and "## Mode `local_only`" in report
    assert "No answer carried `x-spillover-route`" in report
    for name in PLOTS:
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
