"""The gateway's HTTP layer over a fake ModelBackend (same protocol as the Ray one)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from router.errors import (
    ContextLengthExceeded,
    LocalCapacityExhausted,
    NoCapableModel,
    NoTargetFitsContext,
    RequestError,
    TargetUnavailable,
    UpstreamError,
)
from router.request.contract import RequestContract
from router.request.openai_request import Kind
from serve_apps.backend import BackendReply
from serve_apps.dispatch.interfaces import Dispatched, LocalDispatch
from serve_apps.gateway_parts import EdgeSettings, GatewayParts, OperatorParts
from serve_apps.http.surface import GatewayHTTP, ServedModel
from tests.fakes import FakeEngine, delta

MODELS = [
    ServedModel("small", "llama", "cpu", 2048),
    ServedModel("tiny-qwen", "qwen", "cpu", None, synthetic=True),
]


@pytest.fixture
def backend() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
async def client(backend: FakeEngine) -> AsyncIterator[httpx.AsyncClient]:
    ids = iter(f"id-{i}" for i in range(1000))
    gateway = GatewayHTTP(
        backend, MODELS, LocalDispatch(backend), created=123, edge=EdgeSettings(new_id=lambda: next(ids))
    )
    transport = httpx.ASGITransport(app=gateway.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        yield c


CHAT = {"model": "small", "messages": [{"role": "user", "content": "capital of France?"}]}


REASON_ROW = {"target": "local:small", "filter": "context", "reason": "context window 2048 < needed 5000"}


def _assert_openai_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    assert error["code"] == code
    assert "Traceback" not in response.text
    return error


async def test_chat_json_headers(client: httpx.AsyncClient, backend: FakeEngine) -> None:
    response = await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "abc"})
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "Paris"
    assert response.headers["x-request-id"] == "abc"
    assert response.headers["x-spillover-route"] == "local"
    assert response.headers["x-spillover-target"] == "local:small"
    assert [call[:3] for call in backend.calls] == [("small", "chat", CHAT)]


async def test_request_id_generated_when_absent(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.headers["x-request-id"] == "id-0"


async def test_completions_route(client: httpx.AsyncClient, backend: FakeEngine) -> None:
    response = await client.post("/v1/completions", json={"model": "tiny-qwen", "prompt": "hi"})
    assert response.status_code == 200
    assert backend.calls[0][:2] == ("tiny-qwen", "completions")


async def test_stream_passes_events_and_done(client: httpx.AsyncClient) -> None:
    async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-spillover-target"] == "local:small"
        text = "".join([chunk async for chunk in response.aiter_text()])
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert [delta(e) for e in events[:-1]] == ["Pa", "ris"]


@pytest.mark.parametrize(
    "failure",
    [UpstreamError("engine died"), RuntimeError("replica gone")],
)
async def test_mid_stream_failure_ends_with_error_event(
    client: httpx.AsyncClient, backend: FakeEngine, failure: Exception
) -> None:
    backend.fail_mid_stream = failure
    response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    events = [e for e in response.text.split("\n\n") if e]
    assert delta(events[0]) == "Pa"
    assert json.loads(events[1][6:])["error"]["code"] == "upstream_error"
    assert events[-1] == "data: [DONE]"
    assert len(backend.calls) == 1  # never re-sent after the first byte


async def test_malformed_json(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", content=b"{oops")
    _assert_openai_error(response, 400, "invalid_json")


async def test_missing_messages(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json={"model": "small"})
    assert _assert_openai_error(response, 400, "invalid_request")["param"] == "messages"


async def test_unknown_model_lists_models(client: httpx.AsyncClient, backend: FakeEngine) -> None:
    response = await client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-9"})
    error = _assert_openai_error(response, 404, "model_not_found")
    assert "small" in error["message"] and "tiny-qwen" in error["message"]
    assert backend.calls == []


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (NoCapableModel("no target can serve 'small'", reasons=[REASON_ROW]), 422, "no_capable_model"),
        (NoTargetFitsContext("too long for every target", reasons=[REASON_ROW]), 400, "context_length_exceeded"),
    ],
)
async def test_no_capable_target_keeps_reasons(error: RequestError, status: int, code: str) -> None:
    response = await _post(RecordingDispatch(error), {})
    assert _assert_openai_error(response, status, code)
    assert response.json()["error"]["reasons"] == [REASON_ROW]


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (ContextLengthExceeded("prompt has 5000 tokens, window is 2048"), 400, "context_length_exceeded"),
        (TargetUnavailable("replica restarting"), 503, "target_unavailable"),
        (UpstreamError("engine crashed"), 502, "upstream_error"),
    ],
)
async def test_backend_errors_keep_openai_shape(
    client: httpx.AsyncClient, backend: FakeEngine, error: RequestError, status: int, code: str
) -> None:
    backend.fail = error
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert _assert_openai_error(response, status, code)["message"] == error.message


async def test_models_lists_every_configured_model(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/models")
    data = response.json()["data"]
    assert [m["id"] for m in data] == ["small", "tiny-qwen"]
    assert data[1]["metadata"]["synthetic"] is True and data[1]["metadata"]["family"] == "qwen"


async def test_health_and_readiness(client: httpx.AsyncClient, backend: FakeEngine) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["models"] == {"small": "ok", "tiny-qwen": "ok"}
    backend.unhealthy["small"] = "health check timed out after 5s"
    not_ready = await client.get("/readyz")
    assert not_ready.status_code == 503
    assert not_ready.json()["models"]["small"] == "health check timed out after 5s"


async def test_unknown_path_and_method(client: httpx.AsyncClient) -> None:
    _assert_openai_error(await client.get("/v2/nothing"), 404, "not_found")
    _assert_openai_error(await client.get("/v1/chat/completions"), 405, "method_not_allowed")


async def test_unexpected_error_is_500_without_traceback(backend: FakeEngine) -> None:
    async def boom(*args: Any) -> BackendReply:
        raise KeyError("internal bug")

    backend.call = boom  # type: ignore[method-assign]
    gateway = GatewayHTTP(backend, MODELS, LocalDispatch(backend), created=1)
    # Starlette re-raises after answering (so the server logs it); the client still got the 500.
    transport = httpx.ASGITransport(app=gateway.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        response = await c.post("/v1/chat/completions", json=CHAT)
    error = _assert_openai_error(response, 500, "internal_error")
    assert "KeyError" not in error["message"]


async def test_no_request_id_header_when_proxy_sets_it(backend: FakeEngine) -> None:
    gateway = GatewayHTTP(backend, MODELS, LocalDispatch(backend), created=1, edge=EdgeSettings(set_request_id=False))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as c:
        response = await c.post("/v1/chat/completions", json=CHAT)
    assert "x-request-id" not in response.headers
    assert response.headers["x-spillover-target"] == "local:small"


class RecordingDispatch:
    """Same protocol as serve_apps.dispatch.dispatcher.Dispatcher; records the routing hints it got."""

    def __init__(self, error: RequestError | None = None) -> None:
        self.hints: list[tuple[bool, float]] = []
        self.error = error

    async def dispatch(
        self, kind: Kind, body: dict[str, Any], request_id: str, *, contract: RequestContract, deadline_s: float
    ) -> Dispatched:
        self.hints.append((contract.residency == "local_only", deadline_s))
        if self.error:
            raise self.error
        return Dispatched(BackendReply(body={"ok": True}), "cloud", "cloud:sim", "kv_usage 0.91 >= 0.85 …", 0.0)


async def _post(dispatch: RecordingDispatch, headers: dict[str, str]) -> httpx.Response:
    gateway = GatewayHTTP(FakeEngine(), MODELS, dispatch, created=1, edge=EdgeSettings(default_deadline_s=30))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as c:
        return await c.post("/v1/chat/completions", json=CHAT, headers=headers)


async def test_route_headers_from_dispatch() -> None:
    dispatch = RecordingDispatch()
    response = await _post(dispatch, {})
    assert response.headers["x-spillover-route"] == "cloud"
    assert response.headers["x-spillover-target"] == "cloud:sim"
    assert response.headers["x-spillover-reason"] == "kv_usage 0.91 >= 0.85 ?"  # ASCII-safe header
    assert dispatch.hints == [(False, 30)]


async def test_routing_headers_reach_dispatch() -> None:
    dispatch = RecordingDispatch()
    await _post(dispatch, {"x-spillover-residency": "local_only", "x-spillover-deadline-ms": "1500"})
    assert dispatch.hints == [(True, 1.5)]


@pytest.mark.parametrize(
    ("headers", "param"),
    [
        ({"x-spillover-residency": "local_only,eu"}, "x-spillover-residency"),
        ({"x-business-scenario": "nope"}, "x-business-scenario"),
        ({"x-spillover-level": "L9"}, "x-spillover-level"),
        ({"x-spillover-deadline-ms": "soon"}, "x-spillover-deadline-ms"),
        ({"x-spillover-deadline-ms": "0"}, "x-spillover-deadline-ms"),
    ],
)
async def test_bad_routing_headers_are_400(headers: dict[str, str], param: str) -> None:
    dispatch = RecordingDispatch()
    response = await _post(dispatch, headers)
    assert _assert_openai_error(response, 400, response.json()["error"]["code"])["param"] == param
    assert response.json()["error"]["code"] in ("invalid_request", "unknown_scenario")
    assert dispatch.hints == []


async def test_local_capacity_exhausted_is_429_with_retry_after() -> None:
    error = LocalCapacityExhausted("kv_usage 0.91 >= 0.85 on all 1 replicas; local_only: waiting", retry_after_s=2.5)
    response = await _post(RecordingDispatch(error), {"x-spillover-residency": "local_only"})
    _assert_openai_error(response, 429, "local_capacity_exhausted")
    assert response.headers["retry-after"] == "3"
    assert response.headers["x-spillover-reason"].startswith("kv_usage 0.91")


async def test_cluster_snapshot_endpoint(backend: FakeEngine) -> None:
    from router.routing.snapshot import ClusterSnapshot, ReplicaStats

    replica = ReplicaStats("small", "r1", "n1", 99.0, 0.4, 2, 1, 10, 5, 364, 128)
    snapshot = ClusterSnapshot(taken_at=99.5, replicas=(replica,), max_age_s=1.0)
    gateway = GatewayHTTP(
        backend,
        MODELS,
        LocalDispatch(backend),
        created=1,
        operator=OperatorParts(snapshot=lambda: snapshot, clock=lambda: 100.0),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as c:
        data = (await c.get("/v1/spillover/cluster")).json()
    assert data["models"] == ["small", "tiny-qwen"]
    (row,) = data["replicas"]
    assert (row["kv_cache_usage"], row["age_s"], row["stale"]) == (0.4, 1.0, False)


async def test_readiness_waits_for_a_fresh_stats_reading_of_each_model(backend: FakeEngine) -> None:
    """After a redeploy the telemetry board can hold only the previous replica's last reading:
    ready means the gateway would route to the model now, so a fresh reading is needed too."""
    from router.routing.snapshot import ClusterSnapshot, ReplicaStats

    def stats(model: str, read_at: float) -> ReplicaStats:
        return ReplicaStats(model, f"{model}-r", "n1", read_at, 0.1, 0, 0, 0, 0, 364, 128)

    replicas = (stats("small", 58.7),)  # the old replica's reading; nothing yet from tiny-qwen
    gateway = GatewayHTTP(
        backend,
        MODELS,
        LocalDispatch(backend),
        created=1,
        operator=OperatorParts(snapshot=lambda: ClusterSnapshot(100.0, replicas, 1.0), clock=lambda: 100.0),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as c:
        waiting = await c.get("/readyz")
        assert waiting.status_code == 503
        assert waiting.json()["models"] == {
            "small": "no fresh engine stats reading (newest 41.3s old)",
            "tiny-qwen": "no engine stats reading yet",
        }
        replicas = (stats("small", 58.7), stats("small", 99.8), stats("tiny-qwen", 99.9))  # first pushes arrive
        ready = await c.get("/readyz")
    assert ready.status_code == 200 and ready.json()["models"] == {"small": "ok", "tiny-qwen": "ok"}


async def test_cluster_endpoint_without_telemetry_is_404(client: httpx.AsyncClient) -> None:
    _assert_openai_error(await client.get("/v1/spillover/cluster"), 404, "no_telemetry")


async def test_l1_structured_stream_is_400() -> None:
    engine = FakeEngine()
    gateway = GatewayHTTP(engine, MODELS, LocalDispatch(engine), created=1)
    body = {**CHAT, "stream": True, "response_format": {"type": "json_object"}}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as c:
        response = await c.post("/v1/chat/completions", json=body, headers={"x-spillover-level": "L1"})
    assert _assert_openai_error(response, 400, "invalid_request")["param"] == "stream"


async def test_invalid_json_schema_is_400_naming_the_error() -> None:
    engine = FakeEngine()
    gateway = GatewayHTTP(engine, MODELS, LocalDispatch(engine), created=1)
    schema = {"type": "object", "properties": {"a": {"type": "strng"}}}
    body = {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as c:
        response = await c.post("/v1/chat/completions", json=body)
    error = _assert_openai_error(response, 400, "invalid_json_schema")
    assert "strng" in error["message"]


async def test_decision_endpoint(backend: FakeEngine) -> None:
    from router.learning.decision import DecisionRecord, DecisionStore

    store = DecisionStore(max_records=5)
    store.put(DecisionRecord("abc", "7", {}, (), ((), ()), started_at=1.0))
    gateway = GatewayHTTP(backend, MODELS, LocalDispatch(backend), created=1, parts=GatewayParts(decisions=store))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as c:
        found = await c.get("/v1/spillover/decisions/abc")
        missing = await c.get("/v1/spillover/decisions/zzz")
    assert found.status_code == 200 and found.json()["policy_version"] == "7"
    _assert_openai_error(missing, 404, "not_found")


async def test_no_answer_within_request_timeout_is_504() -> None:
    class Slow(RecordingDispatch):
        async def dispatch(self, *args: Any, **kwargs: Any) -> Dispatched:
            await asyncio.sleep(5)
            raise AssertionError("unreachable")

    gateway = GatewayHTTP(FakeEngine(), MODELS, Slow(), created=1, edge=EdgeSettings(request_timeout_s=0.05))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw") as c:
        response = await c.post("/v1/chat/completions", json=CHAT)
    assert "0.05" in _assert_openai_error(response, 504, "request_timeout")["message"]


async def test_non_string_model_is_400_not_500(client: httpx.AsyncClient) -> None:
    """Found by schemathesis: a list as `model` broke the metrics label of the rejection."""
    response = await client.post("/v1/completions", json={"model": ["x"], "prompt": "hi"})
    assert _assert_openai_error(response, 400, "invalid_request")["param"] == "model"
