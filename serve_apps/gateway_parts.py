"""What the gateway's HTTP surface (serve_apps/http/surface.py) is built from, besides its backend,
models and dispatcher: three small bundles, each with the defaults of a bare gateway.

`EdgeSettings`: how every request is named, admitted, bounded and scrubbed at the edge
(serve_apps/http/edge.py, serve_apps/http/guards.py). `GatewayParts`: the collaborators a generation
request meets on its way to the dispatcher and back. `OperatorParts`: what readiness and the operator
routes read and serve. The gateway's composition (serve_apps/gateway_build.py) fills them from the
config's sections and the parts it built once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from cluster.config.gateway import HttpLimits
from router.learning.decision import DecisionStore
from router.request.auth import Authenticator
from router.routing.policy import Policy
from router.routing.snapshot import ClusterSnapshot
from serve_apps.http.guards import DEFAULT_MAX_BODY_BYTES
from serve_apps.http.idempotent import IdempotentReplies
from serve_apps.learning.routes import LearningRoutes
from serve_apps.limits.tenants import TenantLimits
from serve_apps.off_loop.check_pool import RequestChecks
from serve_apps.resilience.golden_gate import GoldenGate
from serve_apps.resilience.routes import OpsRoutes
from serve_apps.state.fallback import StoreView
from serve_apps.telemetry.metrics import GatewayMetrics
from serve_apps.traffic.routes import TrafficRoutes


def new_request_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class EdgeSettings:
    # with one, every /v1/* route needs a tenant's key (router/request/auth.py)
    authenticator: Authenticator | None = None
    new_id: Callable[[], str] = new_request_id  # a request id when the client sent no usable one
    set_request_id: bool = True  # False behind Serve's proxy, which sets x-request-id itself
    redact: Iterable[str] = ()  # names no error text may show a client (serve_apps/http/guards.py)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # 413 past it
    http_limits: HttpLimits | None = None  # headers 431 and the body's deadline 408 (serve_apps/http/guards.py)
    request_timeout_s: float = 300.0  # 504 past it (gateway.request_timeout_s)
    default_deadline_s: float = 30.0  # a request's deadline when it names none (admission.queue_timeout_s)


@dataclass(frozen=True)
class GatewayParts:
    policy: Policy | None = None  # scenarios and their strategies (router/routing/policy.py)
    decisions: DecisionStore | None = None  # the dispatcher's records, read per tenant
    metrics: GatewayMetrics | None = None
    checks: RequestChecks | None = None  # where contracts are derived (serve_apps/off_loop/check_pool.py)
    idempotent: IdempotentReplies | None = None  # Idempotency-Key replays (serve_apps/http/idempotent.py)
    tenant_limits: TenantLimits | None = None  # concurrency and budget per tenant (serve_apps/limits/tenants.py)
    learning: LearningRoutes | None = None  # typing, feedback and quality (serve_apps/learning/routes.py)
    # GET /metrics' body when it is every replica's (serve_apps/telemetry/replica_metrics.py); else `metrics` alone
    metrics_page: Callable[[], Awaitable[bytes]] | None = None


@dataclass(frozen=True)
class OperatorParts:
    snapshot: Callable[[], ClusterSnapshot] | None = (
        None  # the board reader's latest (serve_apps/telemetry/board_reader.py)
    )
    clock: Callable[[], float] = time.time  # the `now` of /v1/spillover/cluster and readiness
    health_timeout_s: float = 5.0  # each model's health check in /readyz
    golden: GoldenGate | None = None  # the start-up golden checks (serve_apps/resilience/golden_gate.py)
    ops: OpsRoutes | None = None  # /v1/spillover/resilience* (serve_apps/resilience/routes.py)
    traffic: TrafficRoutes | None = None  # /v1/spillover/traffic and /v1/spillover/tickets/{id}
    store: Callable[[], StoreView | None] | None = None  # the shared store's state in /readyz
