"""The cloud simulator's faults (in-process through httpx.ASGITransport): server errors, 429 with
Retry-After, hangs, mid-stream cuts, malformed bodies, schema-breaking answers, and how a fault is
drawn from the configured rates (consecutive bands, repeatable for a seed)."""

from __future__ import annotations

import json
import random

import pytest

from bench.cloud_sim import Fault, SimSettings, decide_fault
from tests.unit.cloud_sim_client import RecordingSleep, chat, client_for, make_sim, sse_payloads


async def test_server_error_fault() -> None:
    async with client_for(make_sim(error_5xx_rate=1.0)) as client:
        statuses = [(await client.post("/v1/chat/completions", json=chat())) for _ in range(6)]
    assert {r.status_code for r in statuses} <= {500, 502, 503}
    assert all(r.json()["error"]["type"] == "server_error" for r in statuses)


async def test_rate_limit_fault_sends_retry_after() -> None:
    async with client_for(make_sim(rate_limit_rate=1.0, retry_after_s=2.5)) as client:
        response = await client.post("/v1/chat/completions", json=chat())
    assert response.status_code == 429
    assert response.headers["retry-after"] == "3" and response.headers["retry-after-ms"] == "2500"
    assert response.json()["error"]["code"] == "rate_limit_exceeded"


async def test_timeout_fault_hangs_for_hang_s_then_504() -> None:
    sleep = RecordingSleep()
    async with client_for(make_sim(sleep=sleep, timeout_rate=1.0, hang_s=12.0)) as client:
        response = await client.post("/v1/chat/completions", json=chat())
    assert sleep.calls == [12.0]
    assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"


async def test_midstream_cut_drops_the_stream_before_done() -> None:
    sim = make_sim(midstream_cut_rate=1.0)
    async with client_for(sim) as client:
        response = await client.post("/v1/chat/completions", json=chat(stream=True))
        cut_json = await client.post("/v1/chat/completions", json=chat())
    payloads = sse_payloads(response.text)
    assert response.status_code == 200 and "[DONE]" not in payloads
    assert 2 <= len(payloads) < 9 and all(json.loads(p) for p in payloads)
    with pytest.raises(ValueError):
        json.loads(cut_json.text)
    assert sim.inflight == 0


async def test_malformed_fault_sends_invalid_json() -> None:
    async with client_for(make_sim(malformed_rate=1.0)) as client:
        plain = await client.post("/v1/chat/completions", json=chat())
        streamed = await client.post("/v1/chat/completions", json=chat(stream=True))
    assert plain.status_code == 200
    with pytest.raises(ValueError):
        json.loads(plain.text)
    payloads = sse_payloads(streamed.text)
    with pytest.raises(ValueError):
        json.loads(payloads[1])


async def test_schema_invalid_fault_breaks_only_json_schema_answers() -> None:
    import random as _random

    import httpx as _httpx

    from bench.cloud_sim import SimSettings as _Settings
    from bench.cloud_sim import build_app as _build

    app = _build(_Settings(schema_invalid_rate=1.0, ttft_s=0, tokens_per_s=0), rng=_random.Random(0))
    schema = {"type": "object", "properties": {"capital": {"type": "string"}}, "required": ["capital"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}
    async with _httpx.AsyncClient(transport=_httpx.ASGITransport(app=app), base_url="http://sim") as client:
        with_schema = await client.post(
            "/v1/chat/completions",
            json={"model": "sim-smollm2", "messages": [{"role": "user", "content": "x"}], "response_format": fmt},
        )
        plain = await client.post(
            "/v1/chat/completions", json={"model": "sim-smollm2", "messages": [{"role": "user", "content": "x"}]}
        )
    content = with_schema.json()["choices"][0]["message"]["content"]
    assert with_schema.status_code == 200 and "capital" not in json.loads(content)
    assert plain.json()["choices"][0]["message"]["content"].startswith("[cloud-sim:")


def test_fault_draw_uses_consecutive_bands() -> None:
    settings = SimSettings(error_5xx_rate=0.2, rate_limit_rate=0.2, timeout_rate=0.2, malformed_rate=0.2)

    class Fixed(random.Random):
        def __init__(self, value: float) -> None:
            super().__init__(0)
            self.value = value

        def random(self) -> float:
            return self.value

    draws = {v: decide_fault(settings, Fixed(v)) for v in (0.1, 0.3, 0.5, 0.7, 0.9)}
    assert draws == {
        0.1: Fault.ERROR_5XX,
        0.3: Fault.RATE_LIMIT,
        0.5: Fault.TIMEOUT,
        0.7: Fault.MALFORMED,
        0.9: Fault.NONE,
    }


async def test_faults_repeat_for_the_same_seed() -> None:
    async def statuses(seed: int) -> list[int]:
        async with client_for(make_sim(seed=seed, error_5xx_rate=0.3, rate_limit_rate=0.3)) as client:
            return [(await client.post("/v1/chat/completions", json=chat())).status_code for _ in range(40)]

    first, again, other = await statuses(1), await statuses(1), await statuses(2)
    assert first == again != other
    assert 5 <= first.count(200) <= 30 and 5 <= first.count(429) <= 25
