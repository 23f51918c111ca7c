"""The cloud simulator: replies, timing, capacity, API key, control endpoints, request log (in-process
through httpx.ASGITransport). Its faults: tests/unit/test_cloud_sim_faults.py; the helpers both use:
tests/unit/cloud_sim_client.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.unit.cloud_sim_client import (
    QUESTION,
    RecordingSleep,
    chat,
    client_for,
    make_sim,
    sse_payloads,
    streamed_text,
)


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
