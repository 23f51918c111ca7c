"""Hostile input against the gateway's real HTTP layer (in-process ASGI).

The gateway runs with its real dispatcher, contract pipeline, authenticator, decision store and
cloud provider adapter. Two things are stand-ins: the local engine (`EchoBackend`, the same
`ModelBackend` protocol as the Ray one) and the cloud provider's server, an `httpx.MockTransport`
that answers like OpenAI's chat endpoint (a JSON chat completion, or the error body OpenAI sends)
and records every request exactly as it arrived — what arrives is what these tests are about.
Time bounds are generous: they catch a hang or a quadratic blow-up, not a slow machine.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.config import GatewaySection, SpilloverConfig, dump_config, load_config, parse_config
from cluster.tenants import authenticator_for
from router.decision import DecisionStore
from router.errors import TargetUnavailable
from router.openai_request import Kind
from router.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.backend import BackendReply
from serve_apps.decision_log import JsonlFile
from serve_apps.dispatch import Dispatcher
from serve_apps.gateway_http import GatewayHTTP, ServedModel
from serve_apps.http_guards import client_redactions
from serve_apps.ops_routes import OpsRoutes
from serve_apps.providers import OpenAICompatProvider
from serve_apps.providers.openai_compat import CHAT_FIELDS
from serve_apps.resilience import Resilience
from tests.unit.test_openapi_fuzz import EchoBackend

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
KEYS = {"APPS_KEY": "sk-apps", "OTHER_KEY": "sk-other", "OPS_KEY": "sk-ops"}
APPS, OTHER, OPS = ({"authorization": f"Bearer {k}"} for k in KEYS.values())
BOUND_S = 20.0  # generous: a hang or a blow-up, not a slow CI box


def config(attempts: int = 1, **gateway: Any) -> SpilloverConfig:
    raw = dump_config(load_config(REPO / "configs/local.yaml"))
    raw["cloud"]["providers"][0].update(enabled=True, api_key_env="SIM_PROVIDER_KEY")
    raw["gateway"].update(auth=True, **gateway)
    raw["tenants"] = [
        {"name": "apps", "api_key_env": "APPS_KEY"},
        {"name": "other", "api_key_env": "OTHER_KEY"},
        {"name": "ops", "api_key_env": "OPS_KEY", "admin": True},
    ]
    raw["resilience"] = {"retry": {"max_attempts": attempts, "backoff_base_s": 0.001}, "probes": False}
    return parse_config(raw, "test")


def completion(request: httpx.Request) -> httpx.Response:
    message = {"role": "assistant", "content": "ok"}
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    return httpx.Response(
        200, json={"object": "chat.completion", "choices": [{"index": 0, "message": message}], "usage": usage}
    )


@dataclass
class Gateway:
    app: Any
    decisions: DecisionStore
    provider_requests: list[httpx.Request] = field(default_factory=list)

    def client(self) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
        return httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=BOUND_S)


def build(
    *,
    saturated: bool = False,
    provider: Callable[[httpx.Request], httpx.Response] = completion,
    env: dict[str, str] | None = None,
    decisions: DecisionStore | None = None,
    local: EchoBackend | None = None,
    attempts: int = 1,
    **gateway: Any,
) -> Gateway:
    cfg = config(attempts, **gateway)
    env = {"SIM_PROVIDER_KEY": "sk-provider-secret", **KEYS} if env is None else env
    seen: list[httpx.Request] = []

    def recording(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return provider(request)

    adapter = OpenAICompatProvider(cfg.cloud.providers[0], transport=httpx.MockTransport(recording), env=env)
    kv = 0.99 if saturated else 0.1  # 0.99 > the 0.85 watermark: the request bursts to the cloud
    replica = ReplicaStats(MODEL, "r1", "n1", 0.0, kv, 0, 0, 0, 0, 364, 128)
    snapshot = ClusterSnapshot(taken_at=0.0, replicas=(replica,), max_age_s=1e12)
    resilience = Resilience(cfg, clock=lambda: 0.0)
    store = decisions if decisions is not None else DecisionStore(cfg.gateway.decisions_kept)
    local = local or EchoBackend()
    dispatcher = Dispatcher(
        cfg,
        local,
        {"cloud-sim": adapter},
        lambda: snapshot,
        clock=lambda: 0.0,
        poll_s=0.001,
        decisions=store,
        resilience=resilience,
    )
    http = GatewayHTTP(
        local,
        [ServedModel(MODEL, "llama", "cpu", 4096)],
        created=1,
        dispatcher=dispatcher,
        policy=cfg.policy,
        snapshot=lambda: snapshot,
        decisions=dispatcher.decisions,
        authenticator=authenticator_for(cfg, env),
        ops=OpsRoutes(resilience),
        max_body_bytes=cfg.gateway.max_body_bytes,
        redact=client_redactions(cfg),
        request_timeout_s=10,
    )
    return Gateway(http.app, dispatcher.decisions, seen)


# --- item 1: operator endpoints need an admin tenant when auth is on ---------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/spillover/cluster"), ("GET", "/v1/spillover/resilience"), ("POST", "/v1/spillover/resilience/reset")],
)
async def test_item1_operator_endpoints_need_an_admin_tenant(method: str, path: str) -> None:
    async with build().client() as c:
        anonymous = await c.request(method, path)
        tenant = await c.request(method, path, headers=APPS)
        admin = await c.request(method, path, headers=OPS)
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "invalid_api_key"
    assert tenant.status_code == 403 and tenant.json()["error"]["code"] == "forbidden"
    assert admin.status_code == 200, admin.text


# --- item 5: body size limit, auth before the body -----------------------------------------------------


class CountingBody:
    """A request body that streams `chunks` chunks of `size` bytes and counts how many were read."""

    def __init__(self, chunks: int, size: int = 16 * 1024) -> None:
        self.chunks, self.size, self.read = chunks, size, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.chunks):
            self.read += 1
            yield b" " * self.size


def test_body_size_limit_default_is_8_mib() -> None:
    assert GatewaySection().max_body_bytes == 8 * 1024 * 1024


async def test_body_size_limit_413_before_buffering() -> None:
    limit = 64 * 1024
    body = CountingBody(chunks=6400)  # 100 MiB, never sent in full
    started = time.monotonic()
    async with build(max_body_bytes=limit).client() as c:
        response = await c.post("/v1/chat/completions", content=body, headers=APPS)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    assert body.read <= limit // body.size + 1  # stopped at the chunk that crossed the limit
    assert time.monotonic() - started < BOUND_S


async def test_body_size_limit_declared_length_413_without_reading() -> None:
    body = CountingBody(chunks=10)
    async with build(max_body_bytes=64 * 1024).client() as c:
        headers = {**APPS, "content-length": str(10**12)}
        response = await c.post("/v1/chat/completions", content=body, headers=headers)
    assert response.status_code == 413 and body.read == 0


async def test_body_size_limit_auth_checked_before_the_body_is_read() -> None:
    body = CountingBody(chunks=6400)
    async with build(max_body_bytes=64 * 1024).client() as c:
        wrong = await c.post("/v1/chat/completions", content=body, headers={"authorization": "Bearer sk-guess"})
    assert wrong.status_code == 401 and body.read == 0


async def test_body_size_limit_applies_to_operator_routes() -> None:
    body = CountingBody(chunks=6400)
    async with build(max_body_bytes=64 * 1024).client() as c:
        response = await c.post("/v1/spillover/resilience/reset", content=body, headers=OPS)
    assert response.status_code == 413 and body.read <= 5


async def test_body_under_the_limit_is_served() -> None:
    async with build(max_body_bytes=64 * 1024).client() as c:
        padded = {**CHAT, "messages": [{"role": "user", "content": "x" * 30_000}]}
        response = await c.post("/v1/chat/completions", json=padded, headers=APPS)
    assert response.status_code == 200, response.text


# --- item 6: malformed input is a 400, never a 500 -------------------------------------------------------


def _raw(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


MALFORMED_BODIES = {
    "nested_100k_deep": b'{"model":"m","messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "nested_65_deep": _raw(
        {**CHAT, "messages": [{"role": "user", "content": "x", "extra": json.loads("[" * 65 + "]" * 65)}]}
    ),
    "nan": _raw(CHAT)[:-1] + b', "temperature": NaN}',
    "integer_5000_digits": _raw(CHAT)[:-1] + b', "max_tokens": ' + b"9" * 5000 + b"}",
    "tool_calls_5": _raw(
        {**CHAT, "messages": [{"role": "assistant", "tool_calls": 5}, {"role": "user", "content": "x"}]}
    ),
    "content_5": _raw({**CHAT, "messages": [{"role": "user", "content": 5}]}),
    "tools_5": _raw({**CHAT, "tools": 5}),
    "temperature_text": _raw({**CHAT, "temperature": "hot"}),
    "stop_5": _raw({**CHAT, "stop": 5}),
    "response_format_text": _raw({**CHAT, "response_format": "json"}),
    "not_utf8": b"\xff\xfe\x00",
}


@pytest.mark.parametrize("name", sorted(MALFORMED_BODIES))
async def test_malformed_input_body_is_400_never_500(name: str) -> None:
    started = time.monotonic()
    async with build().client() as c:
        response = await c.post("/v1/chat/completions", content=MALFORMED_BODIES[name], headers=APPS)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] in {"invalid_json", "invalid_request"}
    assert time.monotonic() - started < BOUND_S


MALFORMED_HEADERS = {
    "deadline_400_digits": {"x-spillover-deadline-ms": "9" * 400},
    "deadline_1e400": {"x-spillover-deadline-ms": "1e400"},
    "deadline_nan": {"x-spillover-deadline-ms": "nan"},
    "deadline_negative": {"x-spillover-deadline-ms": "-5"},
    "cost_inf": {"x-spillover-max-cost-usd": "inf"},
    "cost_400_digits": {"x-spillover-max-cost-usd": "9" * 400},
    "level_unknown": {"x-spillover-level": "L9"},
}


@pytest.mark.parametrize("name", sorted(MALFORMED_HEADERS))
async def test_malformed_input_absurd_headers_are_400(name: str) -> None:
    async with build().client() as c:
        response = await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, **MALFORMED_HEADERS[name]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == next(iter(MALFORMED_HEADERS[name]))


@pytest.mark.parametrize("raw_id", ["日本語".encode(), b"\xe9t\xe9", b"a b", b"x" * 129])
async def test_malformed_input_non_ascii_request_id_is_replaced(raw_id: bytes) -> None:
    gateway = build(saturated=True)  # bursts: the id would be sent on to the provider
    async with gateway.client() as c:
        response = await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, "x-request-id": raw_id})
    assert response.status_code == 200, response.text
    new_id = response.headers["x-request-id"]
    assert new_id.encode() != raw_id and new_id.isascii() and new_id.isalnum()
    assert gateway.provider_requests[0].headers["x-request-id"] == new_id


# --- item 7: decision records are the tenant's own ------------------------------------------------------


async def test_decision_records_are_the_tenants_own() -> None:
    async with build().client() as c:
        made = await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, "x-request-id": "shared-1"})
        own = await c.get("/v1/spillover/decisions/shared-1", headers=APPS)
        others = await c.get("/v1/spillover/decisions/shared-1", headers=OTHER)
        admin = await c.get("/v1/spillover/decisions/shared-1", headers=OPS)
    assert made.status_code == 200 and own.status_code == 200
    assert own.json()["request_id"] == "shared-1"
    assert others.status_code == 404 and admin.status_code == 404  # not theirs: as if it did not exist


async def test_decision_record_client_chosen_id_cannot_overwrite_another_tenants() -> None:
    gateway = build()
    async with gateway.client() as c:
        first = await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, "x-request-id": "shared-1"})
        before = (await c.get("/v1/spillover/decisions/shared-1", headers=APPS)).json()
        local_only = {**OTHER, "x-request-id": "shared-1", "x-spillover-residency": "local_only"}
        second = await c.post("/v1/chat/completions", json=CHAT, headers=local_only)
        after = (await c.get("/v1/spillover/decisions/shared-1", headers=APPS)).json()
        theirs = await c.get(f"/v1/spillover/decisions/{second.headers['x-request-id']}", headers=OTHER)
    assert first.status_code == 200 and second.status_code == 200
    assert second.headers["x-request-id"] != "shared-1"  # the other tenant got a new id ...
    assert second.headers["x-spillover-request-id"] == second.headers["x-request-id"]  # ... and is told it
    assert "x-spillover-request-id" not in first.headers
    assert after == before  # the first tenant's record is untouched
    assert theirs.status_code == 200 and theirs.json()["contract"]["residency"] == "local_only"


async def test_decisions_kept_takes_effect() -> None:
    gateway = build(decisions=DecisionStore(max_records=2))
    async with gateway.client() as c:
        for i in range(3):
            await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, "x-request-id": f"r{i}"})
        oldest = await c.get("/v1/spillover/decisions/r0", headers=APPS)
        newest = await c.get("/v1/spillover/decisions/r2", headers=APPS)
    assert len(gateway.decisions) == 2 and oldest.status_code == 404 and newest.status_code == 200


async def test_decisions_log_takes_effect(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    gateway = build(decisions=DecisionStore(max_records=10, sink=JsonlFile(str(log))))
    async with gateway.client() as c:
        for i in range(3):
            await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, "x-request-id": f"r{i}"})
    assert [json.loads(line)["request_id"] for line in log.read_text().splitlines()] == ["r0", "r1", "r2"]


async def test_decisions_log_failing_sink_never_fails_a_request(tmp_path: Path) -> None:
    unwritable = JsonlFile(str(tmp_path))  # a directory: every append raises IsADirectoryError
    gateway = build(decisions=DecisionStore(max_records=10, sink=unwritable))
    async with gateway.client() as c:
        response = await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, "x-request-id": "r0"})
        record = await c.get("/v1/spillover/decisions/r0", headers=APPS)
    assert response.status_code == 200 and record.status_code == 200
    assert gateway.decisions.sink_failures == 1


# --- item 9: only what the target may receive is forwarded ----------------------------------------------


async def test_only_known_fields_and_documented_headers_reach_the_provider() -> None:
    gateway = build(saturated=True)
    body = {**CHAT, "store": True, "metadata": {"k": "v"}, "user": "alice", "x_unknown": 1, "temperature": 0.2}
    headers = {
        **APPS,
        "x-request-id": "req-9",
        "x-spillover-level": "L1",
        "cookie": "session=abc",
        "x-forwarded-for": "10.0.0.9",
        "x-custom-secret": "s3cret",
        "openai-organization": "org-clientchosen1",
    }
    async with gateway.client() as c:
        response = await c.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200 and response.headers["x-spillover-route"] == "cloud", response.text
    (sent,) = gateway.provider_requests
    payload = json.loads(sent.content)
    assert set(payload) <= CHAT_FIELDS
    assert {"store", "metadata", "user", "x_unknown"}.isdisjoint(payload)
    assert payload["temperature"] == 0.2 and payload["model"] == "sim-smollm2"
    assert sent.headers["authorization"] == "Bearer sk-provider-secret"  # the provider's key, not the tenant's
    assert sent.headers["x-request-id"] == "req-9"
    forwarded = {k.lower() for k in sent.headers} - {"host", "accept-encoding", "connection", "user-agent"}
    assert forwarded == {"x-request-id", "accept", "content-type", "content-length", "authorization"}


# --- item 14: error messages name no environment variable, internal host or account id -----------------


def _provider_error(status: int, message: str) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(status, json={"error": {"message": message, "param": None}})


def _unreachable(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection to http://10.20.30.40:8443/v1 refused", request=request)


LEAKS = ("SIM_PROVIDER_KEY", "10.20.30.40", "org-Ab12Cd34Ef", "proj_9xYz8wVu7", "127.0.0.1", "http://")


@pytest.mark.parametrize(
    ("name", "provider", "env"),
    [
        ("key_variable_unset", completion, {**KEYS}),
        ("provider_429_names_org", _provider_error(429, "Rate limit reached in organization org-Ab12Cd34Ef"), None),
        ("provider_400_names_host", _provider_error(400, "upstream http://10.20.30.40:8443 proj_9xYz8wVu7"), None),
        ("provider_500_names_host", _provider_error(500, "backend 10.20.30.40 failed for org-Ab12Cd34Ef"), None),
        ("unreachable", _unreachable, None),
    ],
)
async def test_error_messages_name_no_env_var_host_or_account(
    name: str, provider: Callable[[httpx.Request], httpx.Response], env: dict[str, str] | None
) -> None:
    gateway = build(saturated=True, provider=provider, env=env)
    async with gateway.client() as c:
        response = await c.post("/v1/chat/completions", json=CHAT, headers=APPS)
    assert 400 <= response.status_code < 600 and response.status_code != 500, response.text
    text = response.text + response.headers.get("x-spillover-reason", "")
    assert not [leak for leak in LEAKS if leak in text], text


class DyingReplica(EchoBackend):
    """Fails the way a Ray replica on another node does: TargetUnavailable quoting the node's address."""

    async def call(self, alias: str, kind: Kind, body: dict[str, Any], request_id: str) -> BackendReply:
        raise TargetUnavailable("replica on node 10.20.30.40 (http://10.20.30.40:8265) died")


async def test_error_messages_fail_over_reason_and_decision_record_name_no_host() -> None:
    gateway = build(local=DyingReplica(), attempts=3)  # local, local again (same-target retry), cloud
    async with gateway.client() as c:
        response = await c.post("/v1/chat/completions", json=CHAT, headers={**APPS, "x-request-id": "r1"})
        record = await c.get("/v1/spillover/decisions/r1", headers=APPS)
    assert response.status_code == 200 and response.headers["x-spillover-route"] == "cloud", response.text
    assert "failed before the first byte" in response.headers["x-spillover-reason"]
    assert "10.20.30.40" not in response.headers["x-spillover-reason"]
    assert record.status_code == 200 and "10.20.30.40" not in record.text
