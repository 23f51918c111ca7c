"""schemathesis against the gateway's OpenAPI document: no 5xx, no hang — bodies, paths and the
request headers every route declares (x-request-id, authorization, idempotency-key, x-spillover-*),
with auth off and with auth on (then most requests stop at the key check, and a second run sends the
right key so that the headers behind it are fuzzed too).

The gateway runs in-process with its real dispatcher, contract pipeline and cloud provider
adapter (talking to the in-process cloud simulator through httpx's ASGI transport); only the
local model backend is a fake implementing the same `ModelBackend` protocol.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from bench.cloud_sim import SimSettings
from bench.cloud_sim import build_app as build_cloud_sim
from cluster.config.deployment import dump_config, load_config, parse_config
from cluster.config.tenants import authenticator_for
from router.request.idempotency import IdempotencyStore
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.gateway_parts import EdgeSettings, GatewayParts, OperatorParts
from serve_apps.http.idempotent import IdempotentReplies
from serve_apps.http.surface import GatewayHTTP, ServedModel
from serve_apps.learning.routes import LearningRoutes
from serve_apps.learning.state import Learning
from serve_apps.providers import OpenAICompatProvider
from serve_apps.state.memory import MemoryStore
from tests.fakes import FakeEngine

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"


FUZZ_KEY = "sk-fuzz-tenant"


def build_gateway(auth: bool = False) -> Any:
    raw = dump_config(load_config(REPO / "configs/local.yaml"))
    raw["cloud"]["providers"][0]["enabled"] = True
    raw["cloud"]["providers"][0]["api_key_env"] = None
    if auth:
        raw["gateway"]["auth"] = True
        raw["tenants"] = [{"name": "fuzz", "api_key_env": "FUZZ_KEY", "admin": True}]
    config = parse_config(raw, "fuzz")
    sim = build_cloud_sim(SimSettings(ttft_s=0, tokens_per_s=0, models=["sim-smollm2"]), rng=random.Random(0))
    provider = OpenAICompatProvider(config.cloud.providers[0], transport=httpx.ASGITransport(app=sim))
    replica = ReplicaStats(MODEL, "r1", "n1", 0.0, 0.1, 0, 0, 0, 0, 364, 128)
    snapshot = ClusterSnapshot(taken_at=0.0, replicas=(replica,), max_age_s=1e12)
    backend = FakeEngine(answer="ok")
    dispatcher = Dispatcher(config, backend, {"cloud-sim": provider}, lambda: snapshot, clocks=Clocks.of(lambda: 0.0))
    models = [ServedModel(MODEL, "llama", "cpu", 4096)]
    http = GatewayHTTP(
        backend,
        models,
        dispatcher,
        created=1,
        edge=EdgeSettings(authenticator=authenticator_for(config, {"FUZZ_KEY": FUZZ_KEY}), request_timeout_s=5),
        parts=GatewayParts(
            policy=config.policy,
            decisions=dispatcher.decisions,
            idempotent=IdempotentReplies(IdempotencyStore(MemoryStore(clock=lambda: 0.0), ttl_s=60), wait_s=1),
            learning=LearningRoutes(Learning.from_config(config), dispatcher.decisions),
        ),
        operator=OperatorParts(snapshot=lambda: snapshot),
    )
    return http.app


schema = schemathesis.openapi.from_asgi("/openapi.json", build_gateway())
with_auth = schemathesis.openapi.from_asgi("/openapi.json", build_gateway(auth=True))


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_gateway_never_answers_5xx(case: Any) -> None:
    case.call_and_validate(checks=[not_a_server_error])


@with_auth.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_gateway_with_auth_never_answers_5xx_to_any_header(case: Any) -> None:
    case.call_and_validate(checks=[not_a_server_error])


@with_auth.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_gateway_with_the_right_key_never_answers_5xx_to_any_header(case: Any) -> None:
    case.headers = {**(case.headers or {}), "authorization": f"Bearer {FUZZ_KEY}"}
    case.call_and_validate(checks=[not_a_server_error])
