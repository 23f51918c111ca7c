"""The gateway's real HTTP layer in-process, for the hostile-input tests (test_security_*.py).

The gateway runs with its real dispatcher, contract pipeline, authenticator, decision store and
cloud provider adapter. Two things are stand-ins: the local engine (`FakeEngine` of tests/fakes.py, the same
`ModelBackend` protocol as the Ray one) and the cloud provider's server, an `httpx.MockTransport`
that answers like OpenAI's chat endpoint (a JSON chat completion, or the error body OpenAI sends)
and records every request exactly as it arrived — what arrives is what these tests are about.
Time bounds are generous: they catch a hang or a quadratic blow-up, not a slow machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cluster.config.deployment import SpilloverConfig, dump_config, load_config, parse_config
from cluster.config.tenants import authenticator_for
from router.learning.decision import DecisionStore
from router.request.idempotency import IdempotencyStore
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.gateway_parts import EdgeSettings, GatewayParts, OperatorParts
from serve_apps.http.guards import client_redactions
from serve_apps.http.idempotent import IdempotentReplies
from serve_apps.http.surface import GatewayHTTP, ServedModel
from serve_apps.off_loop.check_pool import RequestChecks
from serve_apps.providers import OpenAICompatProvider
from serve_apps.resilience.routes import OpsRoutes
from serve_apps.resilience.state import Resilience
from serve_apps.sessions.turns import Sessions
from serve_apps.state.memory import MemoryStore
from tests.fakes import FakeEngine

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
KEYS = {"APPS_KEY": "sk-apps", "OTHER_KEY": "sk-other", "OPS_KEY": "sk-ops"}
APPS, OTHER, OPS = ({"authorization": f"Bearer {k}"} for k in KEYS.values())
BOUND_S = 20.0  # generous: a hang or a blow-up, not a slow CI box
HOSTNAME = "gpu-head-01"  # the gateway machine's name (serve_apps/gateway.py passes socket.gethostname())


def config(
    attempts: int = 1, configure: Callable[[dict[str, Any]], None] | None = None, **gateway: Any
) -> SpilloverConfig:
    """configs/local.yaml with its provider on, auth on and three tenants; `configure` edits the raw
    config before it is parsed (e.g. its `sessions` section)."""
    raw = dump_config(load_config(REPO / "configs/local.yaml"))
    raw["cloud"]["providers"][0].update(enabled=True, api_key_env="SIM_PROVIDER_KEY")
    raw["gateway"].update(auth=True, **gateway)
    raw["tenants"] = [
        {"name": "apps", "api_key_env": "APPS_KEY"},
        {"name": "other", "api_key_env": "OTHER_KEY"},
        {"name": "ops", "api_key_env": "OPS_KEY", "admin": True},
    ]
    raw["resilience"] = {"retry": {"max_attempts": attempts, "backoff_base_s": 0.001}, "probes": False}
    if configure is not None:
        configure(raw)
    return parse_config(raw, "test")


def snapshot_at(kv: float) -> ClusterSnapshot:
    """The local model's one replica at KV-cache usage `kv` (above the 0.85 watermark: it bursts)."""
    replica = ReplicaStats(MODEL, "r1", "n1", 0.0, kv, 0, 0, 0, 0, 364, 128)
    return ClusterSnapshot(taken_at=0.0, replicas=(replica,), max_age_s=1e12)


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
    local: FakeEngine | None = None,
    attempts: int = 1,
    idempotent: IdempotentReplies | bool | None = None,
    checks: RequestChecks | None = None,
    configure: Callable[[dict[str, Any]], None] | None = None,
    snapshot: Callable[[], ClusterSnapshot] | None = None,
    sessions: Callable[[SpilloverConfig, FakeEngine], Sessions] | None = None,
    clock: Callable[[], float] = lambda: 0.0,
    **gateway: Any,
) -> Gateway:
    """`snapshot`: the cluster as the gateway reads it, per call (default: fixed, `saturated` or not);
    `sessions`: the gateway's sessions over stores a test shares (default: its own, in-process);
    `clock`: the dispatcher's and resilience's (a request that waits for local room needs one that runs)."""
    cfg = config(attempts, configure, **gateway)
    env = {"SIM_PROVIDER_KEY": "sk-provider-secret", **KEYS} if env is None else env
    seen: list[httpx.Request] = []

    def recording(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return provider(request)

    adapter = OpenAICompatProvider(cfg.cloud.providers[0], transport=httpx.MockTransport(recording), env=env)
    fixed = snapshot_at(0.99 if saturated else 0.1)  # 0.99 > the 0.85 watermark: the request bursts to the cloud
    read = snapshot if snapshot is not None else (lambda: fixed)
    resilience = Resilience(cfg, clock=clock)
    store = decisions if decisions is not None else DecisionStore(cfg.gateway.decisions_kept)
    local = local or FakeEngine(answer="ok")
    dispatcher = Dispatcher(
        cfg,
        local,
        {"cloud-sim": adapter},
        read,
        poll_s=0.001,
        clocks=Clocks.of(clock),
        parts=DispatchParts(
            decisions=store,
            resilience=resilience,
            sessions=sessions(cfg, local) if sessions is not None else None,
            checks=checks.schemas if checks is not None else None,
        ),
    )
    http = GatewayHTTP(
        local,
        [ServedModel(MODEL, "llama", "cpu", 4096)],
        dispatcher,
        created=1,
        edge=EdgeSettings(
            authenticator=authenticator_for(cfg, env),
            redact=client_redactions(cfg, HOSTNAME),
            max_body_bytes=cfg.gateway.max_body_bytes,
            request_timeout_s=10,
        ),
        parts=GatewayParts(
            policy=cfg.policy,
            decisions=dispatcher.decisions,
            checks=checks,
            idempotent=IdempotentReplies(IdempotencyStore(MemoryStore(clock=lambda: 0.0)), wait_s=1.0)
            if idempotent is True
            else (idempotent or None),
        ),
        operator=OperatorParts(snapshot=read, ops=OpsRoutes(resilience)),
    )
    return Gateway(http.app, dispatcher.decisions, seen)
