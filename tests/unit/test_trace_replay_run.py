"""`bench replay` end to end against a scripted gateway (httpx.MockTransport) and through its CLI.

The fake reproduces what the real gateway does with the policies' headers: `x-spillover-residency: local_only`
answers from `local`, a region list answers from `cloud`, no header answers from either (here: alternating), the
route in `x-spillover-route`, usage in the stream's last chunk; one request never answers (a stuck engine), which
the replay must count as unanswered, not lose. Arrivals are real sleeps of a few ms (marked realtime)."""

from __future__ import annotations

import asyncio
import csv
import json
import subprocess
import sys
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.replay.metrics import Prices
from bench.replay.run import ReplayError, ReplayOptions, run_replay
from bench.replay.scaling import Scaling

REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_trace(tmp_path: Path, rows: int = 6) -> Path:
    path = tmp_path / "trace.jsonl"
    lines = [
        {"timestamp": 20 * i, "input_length": 1000 + 10 * i, "output_length": 40, "hash_ids": [0, 1, 100 + i]}
        for i in range(rows)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def scripted_gateway(seen: list[httpx.Request], stuck_index: int | None = None) -> httpx.MockTransport:
    shipped = count()

    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        seen.append(request)
        if stuck_index is not None and request.headers.get("x-request-id", "").endswith(f"-{stuck_index}"):
            await asyncio.sleep(30)
        residency = request.headers.get("x-spillover-residency")
        if residency == "local_only":
            route = "local"
        elif residency:
            route = "cloud"
        else:
            route = "cloud" if next(shipped) % 2 else "local"
        body = json.loads(request.content)
        usage = {"prompt_tokens": len(body["messages"][0]["content"].split()), "completion_tokens": body["max_tokens"]}
        chunks = [{"choices": [{"delta": {"content": "hi"}}]}, {"choices": [], "usage": usage}]
        sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, content=sse.encode(), headers={"x-spillover-route": route})

    return httpx.MockTransport(handle)


def options(tmp_path: Path, **kw: Any) -> ReplayOptions:
    base: dict[str, Any] = {
        "url": "http://gateway/v1",
        "model": "m",
        "trace": str(write_trace(tmp_path)),
        "scaling": Scaling(input_scale=0.01, output_scale=0.25),
        "policies": ("shipped", "local", "cloud"),
        "slo_s": 5.0,
        "drain_s": 0.3,
        "cooldown_s": 0.0,
        "cloud_region": "eu-sim",
        "prices": Prices(1.0, 2.0),
        "out_dir": str(tmp_path / "out"),
        "progress": False,
    }
    return ReplayOptions(**{**base, **kw})


@pytest.mark.realtime
def test_replay_runs_every_policy_on_the_same_arrivals(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []
    outcome = run_replay(options(tmp_path, send_deadline=True), transport=scripted_gateway(seen, stuck_index=2))
    assert outcome.exit_code == 0
    runs = {r.policy.label: r for r in outcome.run.runs}
    assert list(runs) == ["shipped", "local", "cloud"]
    assert len(seen) == 18
    headers = [dict(r.headers) for r in seen]
    assert all("x-spillover-residency" not in h for h in headers[:6])
    assert all(h["x-spillover-residency"] == "local_only" for h in headers[6:12])
    assert all(h["x-spillover-residency"] == "eu-sim" for h in headers[12:])
    assert all(h["x-spillover-deadline-ms"] == "5000" for h in headers)
    bodies = [json.loads(r.content) for r in seen]
    assert all(b["ignore_eos"] is True and b["stream"] is True and b["max_tokens"] == 10 for b in bodies)
    prompts = [b["messages"][0]["content"].split() for b in bodies]
    assert all(len(p) == 10 for p in prompts)  # (1000 + 10 i) × 0.01 tokens, one word each
    assert prompts[0][:10] == prompts[1][:10]  # shared blocks 0 and 1 (5 words each) within a policy
    assert prompts[0][:5] != prompts[6][:5]  # and not across policies
    for run in runs.values():  # request 2 never answers: unanswered, a miss, not lost
        m = run.metrics
        assert m.sent == 6 and m.ok == 5 and m.unanswered == 1 and m.in_slo == 5
        assert m.slo_attainment == pytest.approx(5 / 6)
        row = next(r for r in run.rows if r.index == 2)
        assert row.error == "cancelled" and row.route == "none" and not row.slo_met
    assert runs["local"].metrics.cloud_share == 0 and runs["local"].metrics.spend_usd == 0
    assert runs["cloud"].metrics.cloud_share == 1
    cloud_rows = [r for r in runs["cloud"].rows if r.route == "cloud"]
    assert runs["cloud"].metrics.spend_usd == pytest.approx(
        sum((r.prompt_tokens or 0) * 1.0 + r.output_tokens * 2.0 for r in cloud_rows) / 1e6
    )
    assert 0 < (runs["shipped"].metrics.cloud_share or 0) < 1
    arrivals = [r.arrival_s for r in sorted(runs["local"].rows, key=lambda r: r.index)]
    assert arrivals == [r.arrival_s for r in sorted(runs["cloud"].rows, key=lambda r: r.index)]
    ids = [h["x-request-id"] for h in headers]
    assert len(set(ids)) == 18 and all(i.startswith("replay-") for i in ids)

    out = tmp_path / "out"
    data = json.loads((out / "results.json").read_text())
    assert [p["label"] for p in data["policies"]] == ["shipped", "local", "cloud"]
    assert data["trace"]["format"] == "mooncake" and data["window"]["requests"] == 6
    assert len(data["policies"][0]["requests"]) == 6
    with (out / "requests-cloud.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 6 and {"route", "target", "ttft_s", "e2e_s", "cost_usd", "slo_met"} <= set(rows[0])
    report = (out / "report.md").read_text()
    assert "| shipped |" in report and "| cloud |" in report and "83.3%" in report
    assert (out / "replay_curve.png").read_bytes()[:8] == PNG_SIGNATURE


def test_bad_inputs_fail_before_anything_is_sent(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []
    for kw, message in (
        ({"policies": ()}, "--policies"),
        ({"policies": ("shipped", "shipped")}, "--policies"),
        ({"policies": ("fastest",)}, "unknown policy"),
        ({"slo_s": 0}, "--slo-s"),
        ({"label": " "}, "--label"),
        ({"scaling": Scaling(keep=2)}, "--keep"),
        ({"url": "ftp://gateway"}, "not an http"),
    ):
        with pytest.raises(ReplayError, match=message) as caught:
            run_replay(options(tmp_path, **kw), transport=scripted_gateway(seen))
        assert caught.value.exit_code == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": -1, "output_length": 1}\n')
    with pytest.raises(ReplayError, match="line 1: input tokens"):
        run_replay(options(tmp_path, trace=str(bad)), transport=scripted_gateway(seen))
    assert seen == []


def test_unreachable_or_wrong_model(tmp_path: Path) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(ReplayError, match="cannot reach") as caught:
        run_replay(options(tmp_path), transport=httpx.MockTransport(refuse))
    assert caught.value.exit_code == 1
    with pytest.raises(ReplayError, match="does not serve model 'other'") as caught:
        run_replay(options(tmp_path, model="other"), transport=scripted_gateway([]))
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--keep", "0"], "--keep: must be > 0"),
        (["--policies", "shipped,nope"], "policies are some of"),
        (["--window-at", "noon"], "--window-at: not a number"),
        (["--columns", "time=a"], "error: --columns 'time=a'"),
        (["--format", "azure", "--columns", "time=a,input=b,output=c"], "error: --columns goes with --format csv"),
    ],
)
def test_cli_errors_are_one_line(tmp_path: Path, flags: list[str], message: str) -> None:
    trace = write_trace(tmp_path)
    command = [sys.executable, "-m", "bench", "replay", "--url", "http://127.0.0.1:9/v1", "--model", "m"]
    done = subprocess.run(
        [*command, "--trace", str(trace), *flags], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.realtime
def test_the_offline_bound_from_a_fit_and_bad_fits(tmp_path: Path) -> None:
    perf = {"request_overhead_s": 0.0, "step_s": 0.1, "per_sequence_s": 0.01, "per_prefill_token_s": 0.002}
    fit = tmp_path / "overlay.yaml"
    fit.write_text(json.dumps({"models": [{"alias": "m", "perf": perf}]}))  # JSON is YAML
    outcome = run_replay(options(tmp_path, perf_from=str(fit), policies=("local",)), transport=scripted_gateway([]))
    bound = outcome.run.bound
    assert bound is not None and bound.requests == 0 and bound.share == 0  # 6 small requests, 20 ms apart
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["offline_bound"]["requests"] == 0 and "a·O_max" in data["offline_bound"]["method"]
    assert data["offline_bound"]["clairvoyant"]["requests"] == 0  # one replica: the schedule beside the bound
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Offline lower bound" in report and "A clairvoyant schedule" in report
    for content, message in (
        ("models: [{alias: other, perf: {}}]", "no models\\[\\] entry with alias 'm'"),
        ("models: [{alias: m, perf: {step_s: -1}}]", "its perf is not valid"),
        ("[unclosed", "cannot read it"),
        ("just text", "no models\\[\\] entry"),
    ):
        fit.write_text(content)
        with pytest.raises(ReplayError, match=message) as caught:
            run_replay(options(tmp_path, perf_from=str(fit)), transport=scripted_gateway([]))
        assert caught.value.exit_code == 2
