"""bench.load.loadgen against the in-process cloud simulator (httpx.ASGITransport) and scripted
SSE streams (httpx.MockTransport with a fake clock, for exact timings)."""

from __future__ import annotations

import asyncio
import io
import json
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from bench.cloud_sim import SimSettings, build_app
from bench.load.loadgen import BadBaseUrl, LoadGenerator, check_base_url, make_client, served_models
from bench.load.progress import LineProgress
from bench.load.request_result import CANCELLED
from bench.load.stats import summarize
from bench.load.workload import LengthDist, RequestFactory, WorkItem, WorkloadSpec

MODEL = "sim-model"


async def no_sleep(seconds: float) -> None:
    await asyncio.sleep(0)


def sim_client(*, real_sleep: bool = False, **settings: Any) -> httpx.AsyncClient:
    base = {"models": (MODEL,), "ttft_s": 0.0, "tokens_per_s": 0.0, "max_concurrency": 0}
    app = build_app(
        SimSettings(**{**base, **settings}),
        rng=random.Random(1),
        sleep=asyncio.sleep if real_sleep else no_sleep,
    )
    return make_client("http://sim/v1", transport=httpx.ASGITransport(app=app, raise_app_exceptions=False))


def items(count: int, prompt: str = "fixed:16", output: str = "fixed:8") -> list[WorkItem]:
    spec = WorkloadSpec(LengthDist.parse(prompt), LengthDist.parse(output))
    return RequestFactory(spec, random.Random(0)).take(count)


async def test_closed_loop_measures_tokens_and_excludes_warmup() -> None:
    async with sim_client() as client:
        results = await LoadGenerator(client, MODEL).run_closed(items(10), 3, warmup=2)
    assert len(results) == 10
    assert sum(r.warmup for r in results) == 2
    assert {r.index for r in results if r.warmup} == {0, 1}
    for r in results:
        assert r.ok and r.status == 200
        assert r.output_tokens == 8  # usage.completion_tokens: max_tokens cuts the echo
        assert r.prompt_tokens == 16  # the simulator counts words
        assert r.ttft_s is not None and 0 <= r.ttft_s <= r.e2e_s
        assert r.route is None and r.target is None  # the simulator is not the gateway
    summary = summarize(results)
    assert (summary.count, summary.ok, summary.errors) == (8, 8, 0)
    assert summary.mean_output_tokens == 8


async def test_server_errors_are_counted_with_their_status() -> None:
    async with sim_client(error_5xx_rate=1.0) as client:
        results = await LoadGenerator(client, MODEL).run_closed(items(6), 2)
    assert all(not r.ok and r.status in (500, 502, 503) for r in results)
    assert {r.error for r in results} <= {"http_500", "http_502", "http_503"}
    summary = summarize(results)
    assert summary.error_rate == 1.0 and summary.throughput_rps == 0.0


@pytest.mark.parametrize(
    ("fault", "error"),
    [("midstream_cut_rate", "stream_cut"), ("malformed_rate", "malformed"), ("rate_limit_rate", "rate_limit_exceeded")],
)
async def test_stream_faults_become_error_codes(fault: str, error: str) -> None:
    async with sim_client(**{fault: 1.0}) as client:
        results = await LoadGenerator(client, MODEL).run_closed(items(3), 1)
    assert [r.error for r in results] == [error] * 3


async def test_capacity_429s_beyond_the_simulators_max_concurrency() -> None:
    async with sim_client(real_sleep=True, ttft_s=0.05, max_concurrency=2) as client:
        results = await LoadGenerator(client, MODEL).run_closed(items(12), 4)
    codes = {r.error for r in results}
    assert "capacity_exceeded" in codes and None in codes
    assert all(r.status == 429 for r in results if r.error)


async def test_level_time_limit_cancels_what_is_in_flight() -> None:
    async with sim_client(real_sleep=True, timeout_rate=1.0, hang_s=30.0) as client:
        started = time.monotonic()
        results = await LoadGenerator(client, MODEL).run_closed(items(8), 2, time_limit_s=0.3)
    assert time.monotonic() - started < 5
    assert [r.error for r in results] == [CANCELLED, CANCELLED]  # no new request after the limit
    assert summarize(results).error_rate == 0.0


async def test_request_timeout() -> None:
    async with sim_client(real_sleep=True, timeout_rate=1.0, hang_s=30.0) as client:
        results = await LoadGenerator(client, MODEL, request_timeout_s=0.1).run_closed(items(2), 2)
    assert [r.error for r in results] == ["timeout", "timeout"]


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        for _ in range(5):  # let started tasks run up to their first real wait first
            await asyncio.sleep(0)
        self.now += seconds


class Scripted(httpx.AsyncByteStream):
    """SSE events, each after a delay on the fake clock."""

    def __init__(self, time: FakeTime, parts: list[tuple[float, str]]) -> None:
        self._time = time
        self._parts = parts

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for delay, text in self._parts:
            self._time.now += delay
            yield text.encode()


def event(data: Any) -> str:
    return f"data: {json.dumps(data) if not isinstance(data, str) else data}\n\n"


def delta(**kw: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": kw, "finish_reason": None}]}


def scripted_client(
    time: FakeTime, parts: list[tuple[float, str]], seen: list[dict[str, Any]], queue_s: float = 0.5
) -> httpx.AsyncClient:
    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        time.now += queue_s  # queueing before the headers
        headers = {"x-spillover-route": "cloud", "x-spillover-target": "cloud:cloud-sim"}
        return httpx.Response(200, headers=headers, stream=Scripted(time, parts))

    return make_client("http://gateway:8000/v1", transport=httpx.MockTransport(handler))


async def test_ttft_tpot_e2e_and_route_headers_from_the_stream() -> None:
    time, seen = FakeTime(), []
    parts = [
        (0.0, event(delta(role="assistant", content=""))),  # no output yet
        (0.25, event(delta(content="a"))),
        (0.1, event(delta(content=" b"))),
        (0.1, event(delta(content=" c"))),
        (0.05, event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})),
        (0.0, event("[DONE]")),
    ]
    async with scripted_client(time, parts, seen) as client:
        generator = LoadGenerator(client, "m", clock=time.clock, extra_body={"ignore_eos": True})
        (result,) = await generator.run_closed(items(1), 1)
    assert result.ok
    assert result.ttft_s == pytest.approx(0.75)
    assert result.e2e_s == pytest.approx(1.0)
    assert result.output_tokens == 3  # no usage chunk: content chunks are counted
    assert result.tpot_s == pytest.approx(0.125)
    assert (result.route, result.target) == ("cloud", "cloud:cloud-sim")
    body = seen[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "m" and body["max_tokens"] == 8 and body["ignore_eos"] is True


async def test_usage_and_cached_tokens_and_errors_inside_the_stream() -> None:
    time, seen = FakeTime(), []
    usage = {"prompt_tokens": 40, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 32}}
    parts = [(0.1, event(delta(content="x"))), (0.0, event({"choices": [], "usage": usage})), (0, event("[DONE]"))]
    async with scripted_client(time, parts, seen) as client:
        (ok,) = await LoadGenerator(client, "m", clock=time.clock).run_closed(items(1), 1)
    assert (ok.output_tokens, ok.prompt_tokens, ok.cached_tokens) == (5, 40, 32)
    broken = [(0.1, event(delta(content="x"))), (0.1, event({"error": {"code": "upstream_error"}}))]
    async with scripted_client(time, broken, seen) as client:
        (bad,) = await LoadGenerator(client, "m", clock=time.clock).run_closed(items(1), 1)
    assert bad.error == "upstream_error" and bad.ttft_s is not None


async def test_connect_errors_and_http_error_bodies() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with make_client("http://127.0.0.1:9/v1", transport=httpx.MockTransport(refuse)) as client:
        (result,) = await LoadGenerator(client, "m").run_closed(items(1), 1)
    assert (result.error, result.status) == ("connect_error", None)

    def too_busy(request: httpx.Request) -> httpx.Response:
        body = {"error": {"message": "busy", "type": "x", "param": None, "code": "local_capacity_exhausted"}}
        return httpx.Response(429, json=body, headers={"x-spillover-route": "local"})

    async with make_client("http://gw/v1", transport=httpx.MockTransport(too_busy)) as client:
        (result,) = await LoadGenerator(client, "m").run_closed(items(1), 1)
    assert (result.error, result.status, result.route) == ("local_capacity_exhausted", 429, "local")


async def test_open_loop_starts_requests_at_their_arrival_times() -> None:
    time, seen = FakeTime(), []
    parts = [(0.0, event(delta(content="x"))), (0.0, event("[DONE]"))]
    async with scripted_client(time, parts, seen, queue_s=0.0) as client:
        generator = LoadGenerator(client, "m", clock=time.clock, sleep=time.sleep)
        results = await generator.run_open(items(5), [0.0, 1.0, 3.0, 3.5, 10.0], time_limit_s=5.0)
    # the arrival at 10 s is past the 5 s limit: not sent
    assert len(results) == 4
    assert [r.start_s for r in results] == pytest.approx([0.0, 1.0, 3.0, 3.5])
    with pytest.raises(ValueError, match="arrivals"):
        await generator.run_open(items(1), [0.0, 1.0])


async def test_served_models_and_base_urls() -> None:
    async with sim_client() as client:
        assert await served_models(client) == [MODEL]
    assert check_base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"
    for bad in ("ftp://x/v1", "127.0.0.1:8000", "http:///v1", "http://h/v1?x=1"):
        with pytest.raises(BadBaseUrl):
            check_base_url(bad)


def test_progress_line_live_and_in_logs() -> None:
    clock = iter(float(i) for i in range(100))
    live = io.StringIO()
    progress = LineProgress(live, clock=lambda: next(clock), live=True, interval_s=0)
    progress.start("gateway c=4", 2)
    progress.advance(True)
    progress.advance(False)
    progress.finish()
    text = live.getvalue()
    assert text.count("\r") >= 3 and text.endswith("\n")
    assert "[gateway c=4]  2/2 done  1 errors" in text
    log = io.StringIO()
    quiet = LineProgress(log, clock=lambda: 0.0, live=False)
    quiet.start("model c=1", 1)
    quiet.advance(True)
    quiet.finish()
    assert log.getvalue() == "[model c=1]  1/1 done  0 errors  0.0s\n"


def test_progress_in_logs_every_few_seconds_for_long_runs() -> None:
    now = [0.0]
    log = io.StringIO()
    progress = LineProgress(log, clock=lambda: now[0], live=False, log_every_s=10)
    progress.start("replay shipped", 4)
    for t in (1.0, 11.0, 12.0, 25.0):
        now[0] = t
        progress.advance(True)
    progress.finish()
    assert log.getvalue().splitlines() == [
        "[replay shipped]  2/4 done  0 errors  11.0s",
        "[replay shipped]  4/4 done  0 errors  25.0s",
        "[replay shipped]  4/4 done  0 errors  25.0s",
    ]
