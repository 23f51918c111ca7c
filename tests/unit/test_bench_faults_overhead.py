"""bench faults / overhead: what a client saw is classified right, the medians compared right."""

from __future__ import annotations

import json
from typing import Any

import httpx

from bench.gateway.faults import FaultOptions, FaultRow, _json_request, _stream_request, markdown_table
from bench.gateway.overhead import OverheadOptions, PathStats, comparisons, measure

OPTS = FaultOptions(url="http://gw/v1", sims=("http://sim",), model="m")


def sse(*events: str) -> bytes:
    return "".join(f"data: {e}\n\n" for e in events).encode()


async def classify_stream(content: bytes, status: int = 200) -> str:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, content=content))
    async with httpx.AsyncClient(transport=transport) as client:
        return await _stream_request(client, OPTS, "r1")


async def test_stream_outcomes() -> None:
    chunk = json.dumps({"choices": [{"delta": {"content": "he"}}]})
    error = json.dumps({"error": {"message": "cut", "code": "provider_cut"}})
    assert await classify_stream(sse(chunk, "[DONE]")) == "ok"
    assert await classify_stream(sse(chunk, error, "[DONE]")) == "clean_error"
    assert await classify_stream(sse(chunk)) == "broken"  # no [DONE]: the connection just ended
    assert await classify_stream(sse(chunk, "[DONE]"), status=503) == "broken"


async def test_json_outcomes_name_the_error_code() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["tools"] and body["stream"] is False  # tool requests: cloud targets only
        if request.headers["x-request-id"] == "good":
            return httpx.Response(200, json={"choices": [{"message": {}}]})
        return httpx.Response(503, json={"error": {"code": "target_unavailable"}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        assert await _json_request(client, OPTS, "good") == "ok"
        assert await _json_request(client, OPTS, "bad") == "target_unavailable"


def test_a_row_passes_only_without_lost_resent_or_broken() -> None:
    assert FaultRow("error_5xx", json_sent=4, json_ok=4).passed
    assert not FaultRow("timeout", json_sent=4, json_ok=3, json_lost=1).passed
    assert not FaultRow("midstream_cut", stream_resent=1).passed
    table = markdown_table([FaultRow("reset", json_sent=2, json_ok=1, json_lost=1, lost_codes={"provider_timeout": 1})])
    assert "| reset | 1/2 | 1 (provider_timeout×1) |" in table


def test_comparisons_are_ratios_and_differences_of_medians() -> None:
    stats = [PathStats("direct", [0.10, 0.10, 0.10]), PathStats("ray", [0.11] * 3), PathStats("gateway", [0.13] * 3)]
    by = {(c["path"], c["baseline"]): c for c in comparisons(stats)}
    assert round(by[("gateway", "ray")]["ratio_p50"], 3) == round(0.13 / 0.11, 3)
    assert round(by[("gateway", "direct")]["extra_ms_p50"], 1) == 30.0


async def test_measure_interleaves_every_path_each_round_and_counts_errors() -> None:
    order: list[str] = []

    def call(name: str, fail: bool = False) -> Any:
        async def run(request_id: str) -> None:
            order.append(name)
            if fail:
                raise RuntimeError("down")

        return run

    calls = {"direct": call("direct"), "ray": call("ray", fail=True), "gateway": call("gateway")}
    stats = await measure(calls, OverheadOptions(base_url="http://x", model="m", rounds=5, warmup=1), lambda _: None)
    assert len(order) == 18 and all(sorted(order[i : i + 3]) == ["direct", "gateway", "ray"] for i in range(0, 18, 3))
    assert [len(s.latencies_s) for s in stats] == [5, 0, 5] and stats[1].errors == 5
    assert len({tuple(order[i : i + 3]) for i in range(0, 18, 3)}) > 1  # the order is shuffled


def test_affinity_workload_is_seeded_and_reuses_its_prefixes() -> None:
    import random

    from bench.gateway.affinity import AffinityOptions, ModelResult, markdown_table, prompts

    opts = AffinityOptions(url="http://gw/v1", prefixes=3, prefix_words=50, requests=30)
    first, again = prompts(opts, random.Random(1)), prompts(opts, random.Random(1))
    assert first == again and len(first) == 30
    systems = {text.split("\n\n")[0] for _, text in first}
    assert len(systems) == 3 and all(len(s.split()) == 50 for s in systems)
    assert len({text for _, text in first}) == 30  # every request unique after its prefix
    result = ModelResult("qwen-affinity", [0.01, 0.02], prompt_tokens=200, cached_tokens=150)
    result.replicas = {"r1": {"queries": 200, "hits": 150}}
    assert result.hit_rate == 0.75
    assert "| qwen-affinity | 2 | 0 | 75.0% |" in markdown_table([result])


async def test_the_store_row_reads_each_gateway_answers_server_timing() -> None:
    """`bench overhead`'s store row: the gateway's `Server-Timing: store` entry per measured request (warm-up
    left out); a path that sends none (Ray's ingress, plain vLLM) has no row, and a malformed one is skipped."""
    import httpx

    from bench.gateway.overhead import http_call, store_markdown

    served = iter(
        ['store;dur=1.5;desc="2 ops"', 'store;dur=0.5;desc="2 ops"', "store;dur=junk", 'store;dur=2.5;desc="3 ops"']
    )

    def answer(request: httpx.Request) -> httpx.Response:
        headers = {"server-timing": next(served)} if request.url.path.startswith("/v1") else {}
        return httpx.Response(200, json={"choices": [{"message": {"content": "x"}}]}, headers=headers)

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        calls = {
            "ray": http_call(client, "http://gw/ray/v1/chat/completions", "m"),
            "gateway": http_call(client, "http://gw/v1/chat/completions", "m"),
        }
        stats = await measure(calls, OverheadOptions(base_url="http://gw", model="m", rounds=3, warmup=1), print)
    ray, gateway = stats
    assert ray.store_ms == [] and gateway.store_ms == [0.5, 2.5] and gateway.store_ops == [2, 3]
    table = "\n".join(store_markdown(stats))
    assert "| gateway | 2 |" in table and "| ray |" not in table
    assert store_markdown([ray]) == []
