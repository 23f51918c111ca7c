"""The gateway's composition: every part of one gateway replica, built once, in one place.

`build_gateway(config, handles, env)` builds each part once and hands the same one to every part
that needs it:

* one registry of targets, routes included (router/routing/capabilities.py), for the dispatcher, the traffic
  controls (live scores' prices, the standby's dry-run) and learning (the configured quality);
* one decision store (router/learning/decision.py), written by the dispatcher and read by the decision and
  learning routes; one ticket store (router/traffic/tickets.py), written by the tiered dispatch and read by
  the traffic routes (serve_apps/traffic/wiring.py);
* the shared head-node actors (serve_apps/head_actor.py): the telemetry board, the breaker exchange,
  the traffic board and the session pins (and history, with `sessions.store`);
* the HTTP surface (serve_apps/http/surface.py) with its bundles (serve_apps/gateway_parts.py), filled
  from the config's sections.

One shared store (serve_apps/state/settings.py) holds what every replica must see alike; its fallback's
ping loop runs in the background while Redis does not answer.

It returns the ASGI app and the background loops to start, in this order: the board reader, the
golden checks, the shared store's ping loop (with `state.url`), the prober (with `resilience.probes`), the
breaker sync, the renewal of this replica's admission leases (serve_apps/dispatch/reservations.py), the traffic
sync and the renewal of its tenant leases (`tenants[].max_concurrent`, serve_apps/limits/leases.py).
Nothing runs before the caller starts them (serve_apps/gateway.py, at replica start); they end with the replica.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray.serve.handle import DeploymentHandle

from cluster.config.deployment import SpilloverConfig
from cluster.config.resilience import SpendSection
from cluster.config.tenants import authenticator_for
from cluster.models import CATALOG, cache_dir
from router.errors import SpilloverError
from router.request.idempotency import IdempotencyStore
from router.routing.capabilities import Registry
from router.routing.snapshot import ClusterSnapshot
from serve_apps.dispatch.admission_plans import AdmissionPlans, thread_submit
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.dispatch.reservations import Reservations
from serve_apps.engine.local_backend import ServeHandleBackend
from serve_apps.gateway_parts import EdgeSettings, GatewayParts, OperatorParts
from serve_apps.http.guards import client_redactions
from serve_apps.http.idempotent import IdempotentReplies
from serve_apps.http.model_card import ServedModel, ServedRoute
from serve_apps.http.surface import GatewayHTTP
from serve_apps.learning.decision_log import JsonlFile
from serve_apps.learning.evidence_events import FeedbackEvent, Vocabulary
from serve_apps.learning.pooled_evidence import EvidencePool, EvidenceSinks, PoolSettings
from serve_apps.learning.routes import LearningRoutes
from serve_apps.learning.shared_records import SharedDecisions
from serve_apps.learning.state import Learning, QualityCollector
from serve_apps.limits.shared_spend import SharedSpend
from serve_apps.limits.spend_ledger import SpendLedger
from serve_apps.limits.tenants import TenantLimits
from serve_apps.off_loop.background_writer import BackgroundWriter
from serve_apps.off_loop.check_pool import RequestChecks
from serve_apps.providers import OpenAICompatProvider, provider_for
from serve_apps.resilience.breaker_exchange import (
    BreakerSync,
    get_or_create_exchange,
    ray_reset,
    ray_resets_since,
    ray_swap,
)
from serve_apps.resilience.golden_gate import GoldenGate
from serve_apps.resilience.prober import Prober, cloud_checks, local_checks
from serve_apps.resilience.routes import OpsRoutes
from serve_apps.resilience.state import Resilience
from serve_apps.sessions.actor import get_or_create_history, get_or_create_pins, ray_history, ray_pins
from serve_apps.sessions.history import HistoryClient
from serve_apps.sessions.pins import PinClient
from serve_apps.sessions.turns import Sessions
from serve_apps.state.fallback import FallbackStore
from serve_apps.state.settings import shared_store, store_view
from serve_apps.state.store import SharedStore
from serve_apps.telemetry.board import get_or_create_board
from serve_apps.telemetry.board_reader import BoardReader
from serve_apps.telemetry.metrics import GatewayMetrics
from serve_apps.telemetry.replica_metrics import ReplicaMetrics
from serve_apps.traffic.board import RayBoard, get_or_create_traffic_board
from serve_apps.traffic.controls import Traffic
from serve_apps.traffic.wiring import traffic_parts

log = logging.getLogger("spillover.gateway")
STOP_FLUSH_S = 5.0  # per writer, when the replica stops


@dataclass(frozen=True)
class GatewayEnv:
    """What a gateway replica takes from where it runs."""

    environ: Mapping[str, str]  # the tenants' key variables (cluster/config/tenants.py)
    hostname: str  # a name no error text may show a client (serve_apps/http/guards.py)
    created: int  # the epoch seconds the model cards of /v1/models show
    replica: str = field(default_factory=lambda: uuid.uuid4().hex)  # this replica in the shared actors

    @classmethod
    def here(cls, created: int) -> GatewayEnv:
        return cls(os.environ, socket.gethostname(), created)


@dataclass(frozen=True)
class BuiltGateway:
    app: Any  # the ASGI application (Starlette)
    background: list[Coroutine[Any, Any, None]]  # the loops to start, in order
    # run when Serve stops the replica (after its requests finished): what is queued off the loop gets written
    on_stop: list[Callable[[], None]] = field(default_factory=list)


def served_models(config: SpilloverConfig) -> list[ServedModel]:
    """The configured models as /v1/models lists them."""
    return [
        ServedModel(
            alias=spec.alias,
            family=spec.family,
            accelerator=spec.accelerator,
            max_model_len=spec.engine_args.get("max_model_len"),
            synthetic=spec.is_prepared_source
            and CATALOG.get(spec.prepared_name) is not None
            and CATALOG[spec.prepared_name].synthetic,
        )
        for spec in config.models
    ]


def spend_ledger(section: SpendSection, store: SharedStore) -> SpendLedger | None:
    """The SQLite spend ledger (every cloud attempt's cost; with a shared store, its totals every node's); None
    when it cannot be opened (logged: spend accounting must never stop the gateway from serving)."""
    path = section.ledger or str(cache_dir().parent / "spend.sqlite")
    shared = None
    if isinstance(store, FallbackStore):  # one replica's own memory is no home for a month's spend: SQLite is
        shared = SharedSpend(store, clock=time.time, store_up=lambda: store.view().up)
    try:
        return SpendLedger(path, clock=time.time, background=True, shared=shared)  # SQLite off the event loop
    except SpilloverError as exc:
        log.error("spend ledger disabled: %s", exc.message)
        return None


def prober(
    config: SpilloverConfig,
    backend: ServeHandleBackend,
    providers: Mapping[str, OpenAICompatProvider],
    resilience: Resilience,
    reader: BoardReader,
) -> Prober:
    """Every model's and every provider's health checks, feeding `resilience.health`."""
    checks = []
    for spec in config.models:
        checks += local_checks(spec, config, backend, reader.latest, time.time)
    for provider in providers.values():
        alias = next(iter(provider.config.models), None)
        if alias is not None:
            checks += cloud_checks(provider, alias, config)
    health = config.resilience.health
    return Prober(
        checks,
        resilience.health,
        latency_slo_s=health.latency_slo_s,
        timeout_s=health.probe_timeout_s,
        recovery_probe_s=health.recovery_probe_s,
    )


def sessions(config: SpilloverConfig, backend: ServeHandleBackend, replica: str) -> Sessions:
    """Pins shared by every gateway replica through the head node's actor (serve_apps/sessions/pins.py)."""
    settings = config.sessions
    actor = get_or_create_pins(settings.ttl_s, settings.max_sessions)
    pins = PinClient(*ray_pins(actor), cache_s=settings.cache_s)
    if not settings.store:
        return Sessions(config, backend, pins, replica=replica)
    store = get_or_create_history(settings.ttl_s, settings.history_total_bytes)
    return Sessions(config, backend, pins, HistoryClient(*ray_history(store)), replica=replica)


def evidence_pool(
    config: SpilloverConfig,
    store: SharedStore,
    replica: str,
    registry: Registry,
    learning: Learning,
    traffic: Traffic,
    metrics: GatewayMetrics,
) -> Coroutine[Any, Any, None]:
    """The pool's loop, its hooks on this replica's learning and traffic in place."""
    book = learning.quality
    vocabulary = Vocabulary(
        targets=frozenset(t.id for t in registry.targets),
        scenarios=frozenset(config.policy.scenarios),
        owners=frozenset({"", *(t.name for t in config.tenants)}),
    )

    def feedback(event: FeedbackEvent) -> None:
        if book is not None:
            book.feedback_on(event.target, event.bucket, event.success, event.owner, shared=event.shared)

    sinks = EvidenceSinks(
        quality=None if book is None else book.observe_attempts,
        feedback=feedback,
        outcome=traffic.observed_elsewhere,
    )
    section = config.learning.pool
    settings = PoolSettings(section.period_s, section.max_events, section.live_horizon_s)
    pool = EvidencePool(
        store,
        replica,
        vocabulary,
        sinks,
        wall=time.time,
        settings=settings,
        on_exchanged=lambda counts: metrics.learning_pool(counts.totals()),
    )
    learning.on_recorded.append(pool.recorded)
    learning.on_feedback.append(pool.feedback)
    traffic.on_observed.append(pool.observed)
    return pool.run(asyncio.sleep)


def build_gateway(config: SpilloverConfig, handles: Mapping[str, DeploymentHandle], env: GatewayEnv) -> BuiltGateway:
    metrics = GatewayMetrics()
    # cross-request state every replica sees alike (serve_apps/state/): Redis with state.url, else this replica's
    store = shared_store(config.state, env.environ, on_change=metrics.state_store)
    # no local model takes traffic before it answered its golden prompt right
    golden = GoldenGate({spec.alias: spec.golden for spec in config.models})
    spend = spend_ledger(config.spend, store)
    resilience = Resilience(config, spend=spend, golden=golden, store=store)  # provider RPM / TPM in the store
    gateway = config.gateway
    # the decision log is written by its own thread: a slow disk never stalls the event loop
    sink = BackgroundWriter(JsonlFile(gateway.decisions_log), name="decision-log") if gateway.decisions_log else None

    on_snapshot: list[Callable[[ClusterSnapshot, float], None]] = []  # the dispatcher's, once it is built

    def refreshed(snapshot: ClusterSnapshot, now: float) -> None:
        metrics.replicas(snapshot, now)
        for hook in on_snapshot:
            hook(snapshot, now)
        metrics.resilience(resilience.view())
        if sink is not None:
            metrics.decision_log(failed=sink.failures, dropped=sink.dropped)

    telemetry = config.telemetry
    reader = BoardReader(
        get_or_create_board(),
        min_interval_s=telemetry.poll_period_s,
        max_age_s=telemetry.max_age_s,
        watermarks_for=config.watermarks_for,
        on_refresh=refreshed,
    )
    backend = ServeHandleBackend(dict(handles))
    providers = {
        p.name: provider_for(p, on_headers=resilience.observe_rate_limits) for p in config.cloud.providers if p.enabled
    }
    background: list[Coroutine[Any, Any, None]] = [reader.run(), golden.run(backend)]
    metrics_page = None
    if isinstance(store, FallbackStore):
        background.append(store.run())  # pings a store that stopped answering until it is back
        # several replicas behind one address: a scrape answers with every replica's series, labelled
        shared_metrics = ReplicaMetrics(metrics.registry, store, env.replica[:12])
        background.append(shared_metrics.run())
        metrics_page = shared_metrics.render
    if config.resilience.probes:
        background.append(prober(config, backend, providers, resilience, reader).run())
    exchange = get_or_create_exchange()
    sync = BreakerSync(
        resilience.breakers,
        ray_swap(exchange),
        env.replica,
        period_s=config.resilience.share_period_s,
        resets_since=ray_resets_since(exchange),
    )
    background.append(sync.run())

    # every gateway replica's admissions as leases on each model's limit: together they never pass it
    reservations = Reservations(
        store, env.replica, ttl_s=config.admission.lease_ttl_s, refresh_s=config.telemetry.poll_period_s
    )
    background.append(reservations.run(lambda: [spec.alias for spec in config.models]))
    enabled = [p for p in config.cloud.providers if p.name in providers]
    registry = Registry.from_config(config.models, enabled, routes=config.routes)
    decisions = SharedDecisions(  # every final record also in the shared store (serve_apps/learning/shared_records.py)
        store,
        ttl_s=gateway.decisions_ttl_s,
        max_records=gateway.decisions_kept,
        sink=sink,
        max_bytes=gateway.decisions_max_bytes,
    )
    learning = Learning.from_config(config, registry=registry)  # quality per bucket, feedback, typing
    # schema checks and contract derives: per-tenant admission, fair hand-over (serve_apps/off_loop/check_pool.py)
    checks = RequestChecks.from_settings(gateway.checks.workers, gateway.checks.per_tenant, auth=gateway.auth)
    if learning.quality is not None:
        metrics.registry.register(QualityCollector(learning.quality))
    board = RayBoard(get_or_create_traffic_board())
    traffic = traffic_parts(config, backend, providers, metrics, env.replica, board, registry=registry, store=store)
    shared = DispatchParts(
        registry=registry,
        decisions=decisions,
        observer=learning.observer(metrics),
        resilience=resilience,
        traffic=traffic.traffic,
        sessions=sessions(config, backend, env.replica),
        quality=learning.quality,
        checks=checks.schemas,
        admission_plans=AdmissionPlans(thread_submit()),  # the engine simulations: never on the event loop
        reservations=reservations,
    )
    if isinstance(store, FallbackStore) and config.learning.pool.enabled:
        # every replica learns from every replica's traffic (serve_apps/learning/pooled_evidence.py)
        background.append(evidence_pool(config, store, env.replica, registry, learning, traffic.traffic, metrics))
    dispatcher = Dispatcher(config, backend, providers, reader.latest, parts=shared)
    on_snapshot.append(dispatcher.admission.warm)  # each calibrated model's plan made before a request needs it
    background.append(traffic.traffic.run(config.traffic.sync_period_s, asyncio.sleep))

    idem = config.resilience.idempotency
    # shared by every replica; a marker outlives its request by at most a margin: a dead replica frees its keys
    marker_ttl_s = gateway.request_timeout_s + idem.wait_s
    replies = IdempotencyStore(store, ttl_s=idem.ttl_s, max_bytes=idem.max_bytes, marker_ttl_s=marker_ttl_s)
    limits = TenantLimits(spend.recent_tenant_totals if spend is not None else None, store=store)
    background.append(limits.run())  # renews this replica's tenant leases (serve_apps/limits/leases.py)
    http = GatewayHTTP(
        backend,
        served_models(config),
        traffic.tiered(dispatcher, limits),  # a pending ticket counts against its tenant's limits
        created=env.created,
        routes=[ServedRoute(r.alias, tuple(r.targets)) for r in config.routes],
        edge=EdgeSettings(
            authenticator=authenticator_for(config, env.environ),
            set_request_id=False,  # the Serve proxy sets x-request-id on every response and hands us the same id
            redact=client_redactions(config, env.hostname),
            max_body_bytes=gateway.max_body_bytes,
            http_limits=gateway.http_limits,
            request_timeout_s=gateway.request_timeout_s,
            default_deadline_s=config.admission.queue_timeout_s,
        ),
        parts=GatewayParts(
            policy=config.policy,
            decisions=decisions,
            metrics=metrics,
            checks=checks,
            idempotent=IdempotentReplies(replies, wait_s=idem.wait_s),
            tenant_limits=limits,
            learning=LearningRoutes(learning, decisions),
            metrics_page=metrics_page,
        ),
        operator=OperatorParts(
            snapshot=reader.latest,
            golden=golden,
            ops=OpsRoutes(resilience, on_reset=ray_reset(exchange), forget=traffic.traffic.forget),
            traffic=traffic.routes,
            store=lambda: store_view(store),
        ),
    )
    on_stop: list[Callable[[], None]] = []  # each bounded: a stopping replica must not hang its stop
    if spend is not None:
        on_stop.append(lambda: _flushed("spend ledger", spend.flush(STOP_FLUSH_S)))
    if sink is not None:
        on_stop.append(lambda: _flushed("decision log", sink.flush(STOP_FLUSH_S)))
    return BuiltGateway(http.app, background, on_stop)


def _flushed(what: str, done: bool) -> None:
    if not done:
        log.warning("%s: queued writes not all written within %.0fs of the replica's stop", what, STOP_FLUSH_S)
