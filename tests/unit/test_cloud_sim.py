"""The cloud simulator: replies, timing, capacity, faults, API key, control endpoints, request
log (in-process through httpx.ASGITransport), and the real server as a subprocess."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.cloud_sim import Fault, SimSettings, build_app, decide_fault
from bench.cloud_sim.server import CloudSim

REPO = Path(__file__).resolve().parents[2]
QUESTION = "What is the capital of France?"


class RecordingSleep:
    """Records each requested delay; returns at once (or when `gate` opens)."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.calls: list[float] = []
        self.gate = gate

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(0)


def make_sim(log_path: Path | None = None, *, seed: int = 7, sleep: Any = None, **overrides: Any) -> CloudSim:
    settings = SimSettings(**{"models": ("sim-a", "sim-b"), "ttft_s": 0.0, "tokens_per_s": 0.0, **overrides})
    app = build_app(
        settings,
        rng=random.Random(seed),
        clock=lambda: 1_700_000_000.0,
        sleep=sleep or RecordingSleep(),
        log_path=log_path,
    )
    return app.state.cloud_sim


@asynccontextmanager
async def client_for(sim: CloudSim, **headers: str) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=sim.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim", headers=headers) as client:
        yield client


def chat(model: str = "sim-a", text: str = QUESTION, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


def sse_payloads(text: str) -> list[str]:
    return [block.removeprefix("data: ") for block in text.split("\n\n") if block]


def streamed_text(payloads: list[str]) -> str:
    chunks = [json.loads(p) for p in payloads if p != "[DONE]"]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


async def test_json_reply_has_openai_shape_and_word_usage() -> None:
    async with client_for(make_sim()) as client:
        response = await client.post("/v1/chat/completions", json=chat())
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion" and body["model"] == "sim-a"
    message = body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": f"[cloud-sim:sim-a] {QUESTION}"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 6, "completion_tokens": 7, "total_tokens": 13}
    assert response.headers["x-request-id"] == "sim-000001"


async def test_max_tokens_cuts_the_reply() -> None:
    async with client_for(make_sim()) as client:
        body = (await client.post("/v1/chat/completions", json=chat(max_tokens=3))).json()
    assert body["choices"][0]["message"]["content"] == "[cloud-sim:sim-a] What is"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3


async def test_stream_ends_with_done_and_matches_the_json_text() -> None:
    async with client_for(make_sim()) as client:
        plain = (await client.post("/v1/chat/completions", json=chat())).json()
        response = await client.post(
            "/v1/chat/completions", json=chat(stream=True, stream_options={"include_usage": True})
        )
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"] == plain["usage"]
    assert streamed_text(payloads) == plain["choices"][0]["message"]["content"]


async def test_tool_call_when_required_or_named() -> None:
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 2}},
                "required": ["city"],
            },
        },
    }
    time_tool = {"type": "function", "function": {"name": "get_time"}}
    named = {"type": "function", "function": {"name": "get_time"}}
    async with client_for(make_sim()) as client:
        required = (
            await client.post("/v1/chat/completions", json=chat(tools=[weather], tool_choice="required"))
        ).json()
        chosen = await client.post("/v1/chat/completions", json=chat(tools=[weather, time_tool], tool_choice=named))
        auto = (await client.post("/v1/chat/completions", json=chat(tools=[weather]))).json()
        streamed = await client.post(
            "/v1/chat/completions", json=chat(tools=[weather], tool_choice="required", stream=True)
        )
        unknown = await client.post(
            "/v1/chat/completions", json=chat(tools=[weather], tool_choice={"function": {"name": "nope"}})
        )
    call = required["choices"][0]["message"]["tool_calls"][0]
    assert required["choices"][0]["finish_reason"] == "tool_calls"
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "What is the", "days": 2}
    assert chosen.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_time"
    assert "tool_calls" not in auto["choices"][0]["message"]
    deltas = [json.loads(p)["choices"][0]["delta"] for p in sse_payloads(streamed.text)[:-1]]
    arguments = "".join(t["function"]["arguments"] for d in deltas for t in d.get("tool_calls", []))
    assert arguments == call["function"]["arguments"]
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "tool_choice"


async def test_response_format_json_object_and_json_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "kind": {"enum": ["capital", "town"]},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}},
            "score": {"type": ["number", "null"]},
        },
        "required": ["city", "kind", "tags", "score"],
        "$defs": {"tag": {"type": "object", "properties": {"name": {"type": "string"}}}},
    }
    json_schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    async with client_for(make_sim()) as client:
        loose = (await client.post("/v1/chat/completions", json=chat(response_format={"type": "json_object"}))).json()
        strict = (await client.post("/v1/chat/completions", json=chat(response_format=json_schema))).json()
    assert isinstance(json.loads(loose["choices"][0]["message"]["content"]), dict)
    value = json.loads(strict["choices"][0]["message"]["content"])
    assert value == {"city": "What is the", "kind": "capital", "tags": [{"name": "What is the"}], "score": 1}


async def test_models_healthz_and_unknown_model() -> None:
    async with client_for(make_sim()) as client:
        models = (await client.get("/v1/models")).json()
        health = await client.get("/healthz")
        unknown = await client.post("/v1/chat/completions", json=chat(model="gpt-9"))
        missing_route = await client.get("/v1/nothing")
    assert [m["id"] for m in models["data"]] == ["sim-a", "sim-b"]
    assert health.json() == {"status": "ok"}
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert missing_route.status_code == 404 and "error" in missing_route.json()


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (b"{not json", None),
        (b'{"model": "sim-a", "messages": []}', "messages"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "sim-a", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}', "max_tokens"),
    ],
)
async def test_bad_bodies_are_400_in_openai_shape(content: bytes, param: str | None) -> None:
    async with client_for(make_sim()) as client:
        response = await client.post("/v1/chat/completions", content=content)
    assert response.status_code == 400
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert response.json()["error"]["param"] == param


async def test_latency_follows_ttft_and_token_rate() -> None:
    sleep = RecordingSleep()
    sim = make_sim(sleep=sleep, ttft_s=0.5, tokens_per_s=10.0)
    async with client_for(sim) as client:
        await client.post("/v1/chat/completions", json=chat())
        assert sleep.calls == [pytest.approx(0.5 + 7 * 0.1)]
        sleep.calls.clear()
        await client.post("/v1/chat/completions", json=chat(stream=True))
    assert sleep.calls == [0.5] + [pytest.approx(0.1)] * 7


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


async def test_capacity_beyond_max_concurrency_is_429_until_a_slot_frees() -> None:
    gate = asyncio.Event()
    sim = make_sim(sleep=RecordingSleep(gate), max_concurrency=1, ttft_s=1.0, retry_after_s=4)
    async with client_for(sim) as client:
        slow = asyncio.create_task(client.post("/v1/chat/completions", json=chat(stream=True)))
        for _ in range(200):
            if sim.inflight:
                break
            await asyncio.sleep(0.001)
        assert sim.inflight == 1
        over = await client.post("/v1/chat/completions", json=chat())
        gate.set()
        assert (await slow).status_code == 200
        after = await client.post("/v1/chat/completions", json=chat())
    assert over.status_code == 429 and over.headers["retry-after"] == "4"
    assert over.json()["error"]["code"] == "capacity_exceeded"
    assert after.status_code == 200 and sim.inflight == 0


@pytest.mark.parametrize(
    ("authorization", "status", "code"),
    [(None, 401, "missing_api_key"), ("Bearer wrong", 401, "invalid_api_key"), ("Bearer s3cret", 200, None)],
)
async def test_api_key_required(authorization: str | None, status: int, code: str | None) -> None:
    headers = {"authorization": authorization} if authorization else {}
    async with client_for(make_sim(api_key="s3cret"), **headers) as client:
        response = await client.post("/v1/chat/completions", json=chat())
        models = await client.get("/v1/models")
        health = await client.get("/healthz")
    assert response.status_code == status == models.status_code
    assert health.status_code == 200
    if code:
        assert response.json()["error"]["code"] == code and "s3cret" not in response.text


async def test_control_endpoint_changes_faults_at_runtime_and_resets() -> None:
    async with client_for(make_sim(api_key="s3cret"), authorization="Bearer s3cret") as client:
        shown = (await client.get("/control/faults")).json()
        assert shown["require_api_key"] is True and "s3cret" not in json.dumps(shown)
        assert (await client.post("/v1/chat/completions", json=chat())).status_code == 200
        updated = await client.post("/control/faults", json={"rate_limit_rate": 1.0, "retry_after_s": 9})
        assert updated.json()["rate_limit_rate"] == 1.0
        assert (await client.post("/v1/chat/completions", json=chat())).status_code == 429
        for bad in ({"rate_limit_rate": 2}, {"nope": 1}, {"error_5xx_rate": 0.5}, [1]):
            rejected = await client.post("/control/faults", json=bad)
            assert rejected.status_code == 400 and rejected.json()["error"]["code"] == "invalid_settings"
        assert (await client.post("/control/faults", json=shown)).status_code == 200  # GET output round-trips
        await client.post("/control/faults", json={"require_api_key": False, "rate_limit_rate": 1.0})
        assert (await client.post("/control/reset")).json() == shown
        assert (await client.post("/v1/chat/completions", json=chat())).status_code == 200


CONTROL_ROUTES = [
    ("GET", "/control/faults"),
    ("POST", "/control/faults"),
    ("POST", "/control/reset"),
    ("GET", "/control/stats"),
    ("GET", "/control/log"),
]


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "Basic s3cret", "Bearer s3cret-and-more"])
async def test_cloud_sim_control_requires_key_when_it_has_one(authorization: str | None) -> None:
    """A sim started with a key refuses every /control route without it (401, the /v1 shape), and
    nothing changes: faults stay off, the log is not read. With the key they work; a key set later
    through /control/faults is /v1's, not the control routes'."""
    sim = make_sim(api_key="s3cret")
    headers = {"authorization": authorization} if authorization else {}
    async with client_for(sim, **headers) as stranger:
        refused = [await stranger.request(m, path, json={"error_5xx_rate": 1.0}) for m, path in CONTROL_ROUTES]
    assert [r.status_code for r in refused] == [401] * len(CONTROL_ROUTES)
    assert all(r.json()["error"]["code"] in ("missing_api_key", "invalid_api_key") for r in refused)
    assert sim.settings == sim.initial_settings
    async with client_for(sim, authorization="Bearer s3cret") as operator:
        shown = [await operator.request(m, path) for m, path in CONTROL_ROUTES if m == "GET"]
        assert [r.status_code for r in shown] == [200, 200, 200]
        changed = await operator.post("/control/faults", json={"api_key": "rotated"})
        assert changed.status_code == 200
        assert (await operator.get("/control/stats")).status_code == 200  # still the start key
    async with client_for(sim, authorization="Bearer rotated") as rotated:
        assert (await rotated.post("/v1/chat/completions", json=chat())).status_code == 200
        assert (await rotated.post("/control/reset")).status_code == 401


async def test_cloud_sim_control_is_open_without_a_key() -> None:
    async with client_for(make_sim()) as client:
        assert (await client.post("/control/faults", json={"rate_limit_rate": 1.0})).status_code == 200


async def test_request_log_has_one_line_per_request_and_no_credentials(tmp_path: Path) -> None:
    log_path = tmp_path / "requests.jsonl"
    sim = make_sim(log_path, api_key="s3cret", midstream_cut_rate=0.5)
    headers = {"authorization": "Bearer s3cret", "x-request-id": "req-42", "x-spillover-attempt": "2"}
    async with client_for(sim, **headers) as client:
        for i in range(5):
            await client.post("/v1/chat/completions", json=chat(model="sim-b", stream=i % 2 == 0))
        await client.get("/v1/models")
        await client.post("/v1/chat/completions", json=chat(), headers={"authorization": "Bearer bad"})
        await client.get("/healthz")
    lines = log_path.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 7
    assert [r["request_id"] for r in records] == [f"sim-{i:06d}" for i in range(1, 8)]
    assert records[0]["headers"] == {"x-request-id": "req-42", "x-spillover-attempt": "2"}
    assert [r["model"] for r in records[:5]] == ["sim-b"] * 5
    assert [r["stream"] for r in records[:5]] == [True, False, True, False, True]
    assert {r["fault"] for r in records[:5]} <= {"none", "midstream_cut"}
    assert records[5]["path"] == "/v1/models" and records[6]["status"] == 401
    assert records[6]["error"] == "invalid_api_key"
    text = log_path.read_text().lower()
    assert "authorization" not in text and "s3cret" not in text and "bearer" not in text


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


async def test_request_log_shows_the_system_texts_and_how_many_messages_not_the_turns(tmp_path: Path) -> None:
    log_path = tmp_path / "requests.jsonl"
    body = chat()
    body["messages"] = [
        {"role": "system", "content": "be brief"},
        {"role": "system", "content": "x" * 5000},
        {"role": "user", "content": "private turn"},
    ]
    async with client_for(make_sim(log_path)) as client:
        await client.post("/v1/chat/completions", json=body)
        await client.post("/v1/chat/completions", content=b"not json")
    first, second = (json.loads(line) for line in log_path.read_text().splitlines())
    assert first["messages"] == 3 and first["system"] == ["be brief", "x" * 2000]
    assert "private turn" not in log_path.read_text()
    assert "messages" not in second and "system" not in second
