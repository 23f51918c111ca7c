"""`gateway.http_limits` on the real HTTP layer: hostile raw-socket clients on loopback against a real
uvicorn in this process, serving the gateway's ASGI app (over FakeEngine, a local model as the gateway
reaches it) with `LimitedHttpProtocol` as Serve's proxy does once `proxy_callback` ran
(serve_apps/http/limits.py), and the cloud simulator's own server. Each attack must end in a 4xx or a
closed connection before it gives up (tests/http_attacks.py); an ordinary request still works.
The real Serve proxy: tests/integration/test_http_limits_proxy.py."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import httpx
import pytest
from uvicorn import config as uvicorn_config
from uvicorn.config import Config

from bench.cloud_sim.cli import server_config
from bench.cloud_sim.server import build_app
from bench.cloud_sim.settings import SimSettings
from cluster.config.gateway import HttpLimits
from serve_apps.http.limits import (
    CALLBACK,
    CALLBACK_ENV,
    LIMITS_ENV,
    ProxyHttpProtocol,
    limits_from_env,
    proxy_callback,
    proxy_env,
    uvicorn_options,
)
from tests import http_attacks as attack
from tests.unit import limited_gateway

LIMITS = HttpLimits(max_header_bytes=16 * 1024, max_headers=50, header_timeout_s=1, body_timeout_s=1, idle_timeout_s=1)
HOST = "127.0.0.1"
CHAT = {"model": "small", "messages": [{"role": "user", "content": "capital of France?"}]}
WITHIN_S = 15  # each attack gives up (and the test fails) if the server neither answers nor closes by then


def gateway_app(limits: HttpLimits | None = LIMITS) -> object:
    return limited_gateway.gateway_app(limits)


@pytest.fixture(scope="module")
def proxy() -> Iterator[int]:
    """The gateway's app behind a uvicorn that serves with LIMITS."""
    with attack.running_uvicorn(gateway_app(), **uvicorn_options(LIMITS)) as port:
        yield port


def _refused(outcome: attack.Outcome, *statuses: int) -> None:
    assert outcome.refused, outcome
    assert outcome.status is None or outcome.status in statuses, outcome


def test_proxy_refuses_huge_header_within_bounded_time(proxy: int) -> None:
    _refused(attack.huge_header(HOST, proxy, within_s=WITHIN_S), 431)


def test_proxy_refuses_twenty_thousand_headers(proxy: int) -> None:
    _refused(attack.many_headers(HOST, proxy, 20_000, within_s=WITHIN_S), 431)


def test_proxy_refuses_a_few_too_many_headers_that_arrive_in_one_read(proxy: int) -> None:
    response = httpx.get(f"http://{HOST}:{proxy}/healthz", headers={f"x-{i}": "v" for i in range(60)})
    assert response.status_code == 431
    assert response.json()["error"]["code"] == "request_headers_too_large"
    assert "max_headers = 50" in response.json()["error"]["message"]


def test_proxy_closes_a_slow_loris_client(proxy: int) -> None:
    _refused(attack.slow_loris(HOST, proxy, every_s=0.5, within_s=WITHIN_S), 408)


def test_proxy_closes_a_connection_that_sends_nothing(proxy: int) -> None:
    _refused(attack.idle(HOST, proxy, within_s=WITHIN_S), 408)


def test_proxy_closes_an_idle_kept_alive_connection(proxy: int) -> None:
    status, outcome = attack.idle_after_answer(HOST, proxy, within_s=WITHIN_S)
    assert status == 200
    assert outcome.closed and not outcome.gave_up, outcome


def test_proxy_refuses_a_slow_body(proxy: int) -> None:
    _refused(attack.slow_body(HOST, proxy, "/v1/chat/completions", every_s=0.5, within_s=WITHIN_S), 408)


def test_proxy_still_serves_an_ordinary_client_and_keeps_its_connection(proxy: int) -> None:
    with httpx.Client(base_url=f"http://{HOST}:{proxy}") as client:
        first = client.post("/v1/chat/completions", json=CHAT, headers={f"x-{i}": "v" for i in range(40)})
        second = client.post("/v1/chat/completions", content=json.dumps(CHAT).encode() * 1)
    assert first.status_code == second.status_code == 200
    assert first.json()["choices"][0]["message"]["content"] == "Paris"


@pytest.mark.parametrize(
    "hostile",
    [
        lambda port: attack.huge_header(HOST, port, within_s=WITHIN_S),
        lambda port: attack.many_headers(HOST, port, within_s=WITHIN_S),
        lambda port: attack.slow_loris(HOST, port, every_s=0.5, within_s=WITHIN_S),
        lambda port: attack.idle(HOST, port, within_s=WITHIN_S),
        lambda port: attack.slow_body(HOST, port, "/v1/chat/completions", every_s=0.5, within_s=WITHIN_S),
    ],
    ids=["huge-header", "20000-headers", "slow-loris", "idle", "slow-body"],
)
def test_cloud_sim_server_refuses_hostile_clients(hostile: object) -> None:
    app = build_app(SimSettings(ttft_s=0, tokens_per_s=0), rng=random.Random(0))
    with attack.running_server(server_config(app, HOST, 0, LIMITS)) as port:
        outcome = hostile(port)  # type: ignore[operator]
        assert outcome.refused, outcome
        assert httpx.get(f"http://{HOST}:{port}/healthz").status_code == 200


def test_cloud_sim_serves_with_the_default_limits() -> None:
    config = server_config(object(), HOST, 0)
    assert config.http.limits == HttpLimits()  # type: ignore[union-attr]
    assert config.timeout_keep_alive == HttpLimits().idle_timeout_s


@pytest.mark.realtime  # real sleeps and servers: scripts/test runs it at normal priority
def test_the_gateway_app_alone_refuses_too_many_headers_and_a_slow_body() -> None:
    """Under a server without the limited protocol (plain uvicorn), the gateway's own guards answer:
    431 for the headers, 408 in the OpenAI shape for a body that does not arrive in time."""
    with attack.running_uvicorn(gateway_app()) as port:
        response = httpx.get(f"http://{HOST}:{port}/healthz", headers={f"x-{i}": "v" for i in range(80)})
        slow = attack.slow_body(HOST, port, "/v1/chat/completions", every_s=0.5, within_s=WITHIN_S)
        ok = httpx.post(f"http://{HOST}:{port}/v1/chat/completions", json=CHAT)
    assert response.status_code == 431
    assert response.json()["error"]["code"] == "request_headers_too_large"
    assert slow.status == 408, slow
    assert ok.status_code == 200


def test_proxy_callback_makes_uvicorns_default_protocol_the_limited_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """What Serve's proxy process does with RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH: it calls the
    callback before it builds its uvicorn.Config (which names no protocol: "auto")."""
    env = proxy_env(LIMITS)
    assert env[CALLBACK_ENV] == CALLBACK
    monkeypatch.setitem(uvicorn_config.HTTP_PROTOCOLS, "auto", uvicorn_config.HTTP_PROTOCOLS["auto"])
    monkeypatch.setenv(LIMITS_ENV, env[LIMITS_ENV])
    assert proxy_callback() == []  # no middleware
    config = Config(app=gateway_app(), timeout_keep_alive=LIMITS.idle_timeout_s)
    config.load()
    assert config.http_protocol_class is ProxyHttpProtocol
    assert ProxyHttpProtocol.configured_limits() == LIMITS


def test_limits_from_a_bad_environment_are_the_defaults() -> None:
    assert limits_from_env({}) == HttpLimits()
    assert limits_from_env({LIMITS_ENV: '{"max_headers": 1}'}) == HttpLimits()  # below the minimum
    assert limits_from_env({LIMITS_ENV: LIMITS.model_dump_json()}) == LIMITS
