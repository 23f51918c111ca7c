"""`bench overhead --streams`: interleaved stream batches per path and level, against a real cloud-sim
subprocess (two paths to the same simulator: the numbers are structure, not performance)."""

from __future__ import annotations

import socket
from dataclasses import replace

from bench.cloud_sim.process import running_cloud_sim
from bench.gateway.overhead import OverheadOptions, http_paths
from bench.gateway.overhead_streams import (
    LevelStats,
    StreamOptions,
    StreamRun,
    check_paths,
    extra_headers,
    run_streams,
    stream_comparisons,
    stream_markdown,
)
from bench.load.request_result import RequestResult
from router import headers as hdr


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_streams_are_measured_per_path_and_level() -> None:
    with running_cloud_sim(_port(), ["m"], extra_args=["--ttft-s", "0.01", "--tokens-per-s", "2000"]) as url:
        paths = {"vllm": url, "gateway-http": url}
        check_paths(paths)
        opts = StreamOptions(paths, "m", levels=(1, 3), rounds=2, warmup=1, prompt_words=20, output_tokens=8)
        run = run_streams(opts, lambda line: None)
    assert [(s.concurrency, s.path) for s in run.stats] == [(1, "vllm"), (1, "gateway-http"), (3, "vllm"),
                                                           (3, "gateway-http")]  # fmt: skip
    for level in run.stats:
        assert len(level.ok) == 2 * level.concurrency and level.errors == 0  # measured rounds only
        assert level.ttft(50) is not None and level.tpot(50) is not None and (level.tokens_per_s or 0) > 0
    rows = stream_comparisons(run.stats)
    assert [(r["concurrency"], r["path"], r["baseline"]) for r in rows] == [(1, "gateway-http", "vllm"),
                                                                           (3, "gateway-http", "vllm")]  # fmt: skip
    assert "| 3 | gateway-http vs vllm |" in "\n".join(stream_markdown(run))


def test_only_the_http_provider_paths_carry_the_residency_header() -> None:
    opts = StreamOptions({}, "m", http_region="bench-vllm")
    assert extra_headers("gateway-http", opts) == {hdr.RESIDENCY: "bench-vllm"}
    assert extra_headers("gateway-direct-http", opts) == {hdr.RESIDENCY: "bench-vllm"}
    assert extra_headers("gateway", opts) == {} and extra_headers("vllm", opts) == {}


def test_tokens_per_second_counts_ok_streams_over_the_batches_wall_time() -> None:
    level = LevelStats("vllm", 2, wall_s=2.0)
    level.results = [
        RequestResult(0, 0.0, 1.0, ttft_s=0.1, output_tokens=10, status=200),
        RequestResult(1, 0.0, 1.0, ttft_s=0.3, output_tokens=10, status=200),
        RequestResult(2, 0.0, 1.0, status=503, error="upstream_error"),
    ]
    assert level.tokens_per_s == 10.0 and level.errors == 1
    run = StreamRun(StreamOptions({}, "m"), [level])
    assert run.to_dict()["levels"][0]["error_codes"] == ["upstream_error"]


def test_the_direct_listener_gets_an_http_provider_path_of_its_own() -> None:
    opts = OverheadOptions(
        "http://127.0.0.1:8000/",
        "m",
        vllm_url="http://127.0.0.1:8100/v1/",
        http_region="bench-vllm",
        gateway_direct_url="http://127.0.0.1:8001/v1/",
    )
    assert http_paths(opts) == {
        "vllm": "http://127.0.0.1:8100/v1",
        "gateway-http": "http://127.0.0.1:8000/v1",
        "gateway-direct": "http://127.0.0.1:8001/v1",
        "gateway-direct-http": "http://127.0.0.1:8001/v1",
    }
    assert "gateway-direct-http" not in http_paths(replace(opts, http_region=None))
