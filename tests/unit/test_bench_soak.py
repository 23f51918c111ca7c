"""`bench soak`: the pure parts (lost, windows, growth, verdicts, which process is the stack's), the
traffic's answers (lost or an error) and the fault episodes against the control API. Its short runs
against a fake gateway: tests/unit/test_bench_soak_runs.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.cloud_sim.process import running_cloud_sim
from bench.load.request_result import CANCELLED, RequestResult
from bench.load.workload import LengthDist, RequestFactory, WorkloadSpec
from bench.soak.load import FaultEpisode, FaultPlan, SoakTraffic, TrafficMix, fault_episodes
from bench.soak.metrics import (
    MIB,
    ProcSample,
    SoakRequest,
    Window,
    growth,
    is_lost,
    verdicts,
    window_bounds,
    windows,
)
from bench.soak.procs import ProcessSampler, classify
from router import headers as hdr
from tests.unit.soak_fake_gateway import MODEL, SIM_MODEL, free_port


def res(
    end: float, *, e2e: float = 1.0, error: str | None = None, status: int | None = 200, **kw: Any
) -> RequestResult:
    return RequestResult(0, start_s=end - e2e, e2e_s=e2e, error=error, status=status, **kw)


def req(end: float, e2e: float = 1.0, kind: str = "json", **kw: Any) -> SoakRequest:
    wrong = kw.pop("wrong", False)
    return SoakRequest(kind, "mixed" if kind != "probe" else "probe", res(end, e2e=e2e, **kw), wrong=wrong)


# -- lost or an error ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "lost"),
    [
        (res(1), False),
        (res(1, error="rate_limit_exceeded", status=429), False),  # the gateway said no: an error
        (res(1, error="http_502", status=502), False),
        (res(1, error="stream_error", status=200), False),  # an error event in the stream: clean
        (res(1, error="stream_cut", status=200), True),  # ended without [DONE] and without an error
        (res(1, error="malformed", status=200), True),
        (res(1, error="no_answer", status=200), True),
        (res(1, error="connect_error", status=None), True),
        (res(1, error="timeout", status=None), True),
        (res(1, error=CANCELLED, status=None), False),  # cut by the end of the run, not by the stack
    ],
)
def test_a_request_is_lost_only_without_an_answer_and_without_an_error(result: RequestResult, lost: bool) -> None:
    assert is_lost(result) is lost


# -- windows -----------------------------------------------------------------------------


def test_window_bounds_keep_a_last_partial_window_of_at_least_half() -> None:
    assert window_bounds(300, 1800) == [(i * 300.0, (i + 1) * 300.0) for i in range(6)]
    assert window_bounds(300, 1700)[-1] == (1500.0, 1700.0)
    assert len(window_bounds(300, 1620)) == 5
    assert window_bounds(300, 10) == [(0.0, 10.0)]


def test_windows_count_by_end_time_and_judge_latency_without_probes() -> None:
    bounds = window_bounds(10, 30)
    requests = [
        req(1, 0.5),
        req(2, 0.7, kind="stream", ttft_s=0.1),
        req(3, error="rate_limit_exceeded", status=429),
        req(4, kind="probe", e2e=9.0),
        req(5, kind="probe", wrong=True),
        req(12, 2.0),
        req(13, error="connect_error", status=None),
        req(29, 3.0),
        req(35, 4.0),  # ended in the drain, after the last window: counts in it (not in its latencies)
        req(36, error=CANCELLED, status=None),
    ]
    w0, w1, w2 = windows(requests, bounds)
    assert (w0.requests, w0.ok, w0.errors, w0.lost, w0.probes, w0.wrong) == (5, 4, 1, 0, 2, 1)
    assert w0.e2e_p99_s == pytest.approx(0.698) and w0.ttft_p50_s == pytest.approx(0.1)  # probes left out
    assert w0.error_codes == {"rate_limit_exceeded": 1}
    assert (w1.requests, w1.errors, w1.lost) == (2, 1, 1)
    assert (w2.requests, w2.ok, w2.cancelled, w2.errors) == (3, 2, 1, 0)
    assert w2.e2e_p50_s == pytest.approx(3.0) and w2.ttft_p99_s is None  # the drain's 4 s answer is not timed


# -- growth and verdicts -----------------------------------------------------------------


def _samples(role: str, pid: int, values: list[tuple[float, int, int]]) -> list[ProcSample]:
    return [ProcSample(t, role, pid, rss, fds) for t, rss, fds in values]


BOUNDS = window_bounds(10, 40)  # warm-up 0-10, second 10-20, ..., last 30-40


def test_growth_compares_the_median_of_the_last_window_with_the_second() -> None:
    gib = 1024 * MIB
    samples = [
        *_samples("VLLM::EngineCore", 10, [(1, gib, 50), (11, 2 * gib, 60), (15, 2 * gib, 60), (31, 2 * gib, 60),
                                           (35, 2 * gib + 50 * MIB, 60)]),  # +1.2%: fine
        *_samples("ServeReplica:spillover:SpilloverGateway", 11, [(11, 400 * MIB, 80), (35, 440 * MIB, 80)]),  # +10%
        *_samples("raylet", 12, [(11, 30 * MIB, 99), (35, 36 * MIB, 101)]),  # +20% RSS but 6 MiB: slack
        *_samples("cloud-sim", 13, [(11, 80 * MIB, 20), (35, 80 * MIB, 30)]),  # FDs +50%, 10 descriptors
        *_samples("ray::ProxyActor", 14, [(11, 200 * MIB, 60)]),  # gone before the last window
        *_samples("ray::IDLE", 15, [(11, 80 * MIB, 40)]),  # gone too, but Ray ends idle workers at will
        *_samples("VLLM::Worker", 16, [(31, 900 * MIB, 40)]),  # new after the second window
    ]  # fmt: skip
    found = {g.role: g for g in growth(samples, BOUNDS)}
    engine = found["VLLM::EngineCore"]
    assert engine.status == "measured" and engine.passed and engine.rss_growth == pytest.approx(25 / 2048)
    assert found["ServeReplica:spillover:SpilloverGateway"].passed is False
    assert found["raylet"].passed is True and found["raylet"].rss_growth == pytest.approx(0.2)
    assert found["cloud-sim"].passed is False and found["cloud-sim"].fds_growth == pytest.approx(0.5)
    assert (found["ray::ProxyActor"].status, found["ray::ProxyActor"].passed) == ("gone", False)
    assert (found["ray::IDLE"].status, found["ray::IDLE"].passed) == ("gone", None)
    assert (found["VLLM::Worker"].status, found["VLLM::Worker"].passed) == ("new", None)
    assert growth(samples, window_bounds(10, 20)) == []  # two windows: nothing to compare


def _window(index: int, p99: float | None, *, lost: int = 0, wrong: int = 0, probes: int = 1) -> Window:
    return Window(index, index * 10.0, index * 10.0 + 10, 10, 10, 0, lost, 0, probes, wrong, 0, 1.0, p99, None, None)


def test_verdicts_pass_on_a_clean_run() -> None:
    steady = [ProcSample(t, "raylet", 1, 30 * MIB, 99) for t in (11, 35)]
    found = verdicts([_window(0, 9.0), _window(1, 2.0), _window(2, 2.5), _window(3, 2.9)], growth(steady, BOUNDS))
    assert [v.name for v in found] == ["growth", "p99", "lost", "wrong"]
    assert all(v.passed for v in found), found
    assert "×1.45" in found[1].line


def test_each_verdict_fails_on_its_own() -> None:
    steady = growth([ProcSample(t, "raylet", 1, 30 * MIB, 99) for t in (11, 35)], BOUNDS)
    leaky = growth([ProcSample(11, "raylet", 1, 300 * MIB, 99), ProcSample(35, "raylet", 1, 400 * MIB, 99)], BOUNDS)
    ok = [_window(0, 1.0), _window(1, 2.0), _window(2, 2.0)]
    assert not verdicts(ok, leaky)[0].passed and "raylet [1]" in verdicts(ok, leaky)[0].line
    slow = [_window(0, 1.0), _window(1, 2.0), _window(2, 3.1)]
    assert not verdicts(slow, steady)[1].passed
    lost = [_window(0, 1.0, lost=1), _window(1, 2.0), _window(2, 2.0)]
    assert not verdicts(lost, steady)[2].passed
    wrong = [_window(0, 1.0), _window(1, 2.0, wrong=1), _window(2, 2.0)]
    assert not verdicts(wrong, steady)[3].passed
    unprobed = [_window(i, 2.0, probes=0) for i in range(3)]
    assert not verdicts(unprobed, steady)[3].passed and "not judged" in verdicts(unprobed, steady)[3].line


def test_too_short_a_run_is_not_judged_and_not_passed() -> None:
    found = verdicts([_window(0, 1.0), _window(1, 1.0)], [])
    assert not found[0].passed and not found[1].passed
    assert "not judged" in found[0].line and "not judged" in found[1].line


# -- which processes are the stack's -----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cmdline", "role"),
    [
        ("VLLM::EngineCor", ["VLLM::EngineCore"], "VLLM::EngineCore"),
        ("VLLM::Worker_TP", ["VLLM::Worker_TP0"], "VLLM::Worker_TP0"),
        ("ray::ServeRepli", ["ray::ServeReplica:spillover:Gateway"], "ServeReplica:spillover:Gateway"),
        ("ray::ServeRepli", ["ray::ServeReplica:spillover:LLMServer:smollm2-135m-instruct.initialize_and_get_metadata"],
         "ServeReplica:spillover:LLMServer:smollm2-135m-instruct"),
        ("ray::SERVE_REPL", ["ray::SERVE_REPLICA::spillover#SpilloverLLMServer:m#x1:ServeReplica:spillover:LLM:m"],
         "ServeReplica:spillover:LLM:m"),
        ("ray::ServeContr", ["ray::ServeController.listen_for_change"], "ray::ServeController"),
        ("ray::IDLE", ["ray::IDLE"], "ray::IDLE"),
        ("raylet", ["/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet", "--head"], "raylet"),
        ("gcs_server", ["/venv/.../gcs_server", "--log_dir=/tmp"], "gcs_server"),
        ("python3", ["/venv/bin/python3", "/venv/lib/python3.11/site-packages/ray/dashboard/dashboard.py"],
         "ray dashboard"),
        ("python3", ["/venv/bin/python3", "-u", "/venv/.../ray/_private/log_monitor.py"], "ray log monitor"),
        ("python", ["/venv/bin/python", "-m", "bench.cloud_sim", "--port", "9100", "--models", "a"], "cloud-sim"),
        ("python", ["/venv/bin/python", "-m", "bench.cloud_sim", "--port", "9555"], None),  # another test's sim
        ("spillover", ["/venv/bin/python3", ".venv/bin/spillover", "serve", "--config", "c.yaml"], "spillover serve"),
        ("python3", ["/venv/bin/python3", "-m", "pytest", "tests/unit"], None),
        ("bash", ["bash"], None),
    ],
)  # fmt: skip
def test_classify_names_the_stack_processes(name: str, cmdline: list[str], role: str | None) -> None:
    assert classify(name, cmdline, sim_port=9100) == role


def test_the_sampler_sees_a_cloud_sim_subprocess_on_its_port(tmp_path: Path) -> None:
    port = free_port()
    with running_cloud_sim(port, [SIM_MODEL]):
        samples = ProcessSampler(sim_port=port).sample(0.0)
        sims = [s for s in samples if s.role == "cloud-sim"]
        assert len(sims) == 1 and sims[0].rss_bytes > MIB and sims[0].fds > 0
        assert all(s.pid != os.getpid() for s in samples)


# -- the traffic's answers -----------------------------------------------------------------


def _traffic(handler: Any, **mix: Any) -> SoakTraffic:
    client = httpx.AsyncClient(base_url="http://127.0.0.1:8000/v1/", transport=httpx.MockTransport(handler))
    spec = WorkloadSpec(LengthDist.parse("fixed:8"), LengthDist.parse("fixed:4"))
    rng = random.Random(0)
    return SoakTraffic(client, MODEL, TrafficMix(**mix), RequestFactory(spec, rng), rng=rng, clock=time.monotonic)


def _chat(content: str | None) -> dict[str, Any]:
    message = {"role": "assistant", "content": content}
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": {"completion_tokens": 3}}


@pytest.mark.parametrize(
    ("respond", "error", "lost"),
    [
        (lambda r: httpx.Response(200, json=_chat("hello"), headers={hdr.ROUTE: "local"}), None, False),
        (lambda r: httpx.Response(200, content=b'{"choices": [{"mess'), "malformed", True),
        (lambda r: httpx.Response(200, json={"choices": []}), "no_answer", True),
        (lambda r: httpx.Response(503, json={"error": {"code": "no_capable_model"}}), "no_capable_model", False),
        (lambda r: httpx.Response(502, content=b""), "http_502", False),
    ],
)
async def test_a_json_answer_is_ok_an_error_or_lost(respond: Any, error: str | None, lost: bool) -> None:
    traffic = _traffic(respond)
    item, _, _ = traffic.draw()
    sent = await traffic.send(item, "json", "mixed")
    assert sent.result.error == error and sent.lost is lost


async def test_a_refused_connection_and_a_cut_stream_are_lost_an_error_event_is_not() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    traffic = _traffic(refuse)
    assert (await traffic.send(traffic.draw()[0], "json", "mixed")).lost
    cut = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
    traffic = _traffic(lambda r: httpx.Response(200, content=cut, headers={"content-type": "text/event-stream"}))
    assert (await traffic.send(traffic.draw()[0], "stream", "mixed")).lost
    clean = cut + b'data: {"error": {"code": "upstream_cut", "message": "cut"}}\n\ndata: [DONE]\n\n'
    traffic = _traffic(lambda r: httpx.Response(200, content=clean, headers={"content-type": "text/event-stream"}))
    sent = await traffic.send(traffic.draw()[0], "stream", "mixed")
    assert sent.result.error == "upstream_cut" and not sent.lost


async def test_cloud_share_carries_the_region_and_the_probe_is_greedy_local_and_compared() -> None:
    seen: list[httpx.Request] = []
    answers = iter(["Paris.", "Paris.", "Lyon."])

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        body = json.loads(request.content)
        return httpx.Response(200, json=_chat(next(answers) if body.get("temperature") == 0 else "x"))

    traffic = _traffic(handler, cloud_share=1.0, stream_share=0.0)
    item, kind, share = traffic.draw()
    assert (kind, share) == ("json", "cloud")
    await traffic.send(item, kind, share)
    assert seen[-1].headers[hdr.RESIDENCY] == "local-sim" and "temperature" not in json.loads(seen[-1].content)
    await traffic.send(item, "stream", share)  # the streamed path carries it too
    assert seen[-1].headers[hdr.RESIDENCY] == "local-sim" and json.loads(seen[-1].content)["stream"] is True
    probes = [await traffic.probe(-i) for i in range(1, 4)]
    assert [p.wrong for p in probes] == [False, False, True] and probes[2].answer == "Lyon."
    body = json.loads(seen[-1].content)
    assert seen[-1].headers[hdr.RESIDENCY] == "local_only" and body["temperature"] == 0


# -- fault episodes ---------------------------------------------------------------------


async def test_fault_episodes_switch_one_fault_on_then_restore_what_was_there() -> None:
    posted: list[dict[str, Any]] = []

    def control(request: httpx.Request) -> httpx.Response:
        posted.append(json.loads(request.content))
        return httpx.Response(200, json={})

    original = {"error_5xx_rate": 0.0, "rate_limit_rate": 0.0, "hang_s": 30.0, "retry_after_s": 1.0}
    plan = FaultPlan(faults=("error_5xx", "rate_limit"), rate=0.2, every_s=0.01, duration_s=0.01, max_episodes=3)
    episodes: list[FaultEpisode] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(control)) as client:
        await fault_episodes(client, "http://127.0.0.1:9100", plan, original, asyncio.Event(), time.monotonic, episodes)
    assert [e.fault for e in episodes] == ["error_5xx", "rate_limit", "error_5xx"]
    assert all(e.error is None and e.end_s >= e.start_s for e in episodes)
    assert posted[0] == {"error_5xx_rate": 0.2, "hang_s": 5.0, "retry_after_s": 1.0}
    assert posted[1] == {"error_5xx_rate": 0.0, "hang_s": 30.0, "retry_after_s": 1.0}
    assert posted[2]["rate_limit_rate"] == 0.2 and len(posted) == 6
