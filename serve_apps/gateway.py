"""The gateway: Ray Serve ingress deployment every client calls.

It holds one DeploymentHandle per configured model and serves `GatewayHTTP`'s ASGI app
(built at replica start through Serve's `__serve_build_asgi_app__` hook).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from cluster.config import parse_config
from cluster.models import CATALOG, cache_dir
from cluster.render import GATEWAY_DEPLOYMENT
from cluster.tenants import authenticator_for
from router.decision import DecisionStore
from router.errors import SpilloverError
from router.idempotency import IdempotencyStore
from router.snapshot import ClusterSnapshot
from serve_apps.background_writer import BackgroundWriter
from serve_apps.board_poller import BoardPoller
from serve_apps.breaker_exchange import BreakerSync, get_or_create_exchange, ray_resets_since, ray_swap
from serve_apps.check_pool import RequestChecks
from serve_apps.decision_log import JsonlFile
from serve_apps.dispatch import Dispatcher
from serve_apps.gateway_http import GatewayHTTP, ServedModel
from serve_apps.golden_gate import GoldenGate
from serve_apps.http_guards import client_redactions
from serve_apps.idempotent import IdempotentReplies
from serve_apps.learning import Learning, QualityCollector
from serve_apps.learning_routes import LearningRoutes
from serve_apps.local_backend import ServeHandleBackend
from serve_apps.logs import configure_json_logs
from serve_apps.metrics import GatewayMetrics
from serve_apps.model_card import ServedRoute
from serve_apps.ops_routes import OpsRoutes
from serve_apps.prober import Prober, cloud_checks, local_checks
from serve_apps.providers import OpenAICompatProvider, provider_for
from serve_apps.resilience import Resilience
from serve_apps.session_actor import get_or_create_history, get_or_create_pins, ray_history, ray_pins
from serve_apps.session_history import HistoryClient
from serve_apps.session_pins import PinClient
from serve_apps.sessions import Sessions
from serve_apps.spend_ledger import SpendLedger
from serve_apps.telemetry_board import get_or_create_board
from serve_apps.tenant_limits import TenantLimits
from serve_apps.traffic_wiring import traffic_parts

log = logging.getLogger("spillover.gateway")


@serve.deployment(name=GATEWAY_DEPLOYMENT, max_ongoing_requests=1000)
@serve.ingress()
class Gateway:
    def __init__(self, config: dict[str, Any], handles: dict[str, DeploymentHandle]) -> None:
        self._config = parse_config(config, "(deployed config)")
        self._handles = handles
        self._created = int(time.time())

    def _spend_ledger(self) -> SpendLedger | None:
        """The SQLite spend ledger (every cloud attempt's cost); None when it cannot be opened
        (logged: spend accounting must never stop the gateway from serving)."""
        path = self._config.spend.ledger or str(cache_dir().parent / "spend.sqlite")
        try:
            return SpendLedger(path, clock=time.time, background=True)  # SQLite off the event loop
        except SpilloverError as exc:
            log.error("spend ledger disabled: %s", exc.message)
            return None

    def _prober(
        self, backend: ServeHandleBackend, providers: dict[str, OpenAICompatProvider], resilience: Resilience
    ) -> Prober:
        checks = []
        for spec in self._config.models:
            checks += local_checks(spec, self._config, backend, self._poller.latest, time.time)
        for provider in providers.values():
            alias = next(iter(provider.config.models), None)
            if alias is not None:
                checks += cloud_checks(provider, alias, self._config)
        health = self._config.resilience.health
        return Prober(
            checks,
            resilience.health,
            latency_slo_s=health.latency_slo_s,
            timeout_s=health.probe_timeout_s,
            recovery_probe_s=health.recovery_probe_s,
        )

    def _sessions(self, backend: ServeHandleBackend, replica: str) -> Sessions:
        """Pins shared by every gateway replica through the head node's actor (serve_apps/session_pins.py)."""
        settings = self._config.sessions
        actor = get_or_create_pins(settings.ttl_s, settings.max_sessions)
        pins = PinClient(*ray_pins(actor), cache_s=settings.cache_s)
        if not settings.store:
            return Sessions(self._config, backend, pins, replica=replica)
        store = get_or_create_history(settings.ttl_s, settings.history_total_bytes)
        return Sessions(self._config, backend, pins, HistoryClient(*ray_history(store)), replica=replica)

    async def __serve_build_asgi_app__(self) -> Any:
        configure_json_logs()
        models = [
            ServedModel(
                alias=spec.alias,
                family=spec.family,
                accelerator=spec.accelerator,
                max_model_len=spec.engine_args.get("max_model_len"),
                synthetic=spec.is_prepared_source
                and CATALOG.get(spec.prepared_name) is not None
                and CATALOG[spec.prepared_name].synthetic,
            )
            for spec in self._config.models
        ]
        telemetry = self._config.telemetry
        metrics = GatewayMetrics()
        # no local model takes traffic before it answered its golden prompt right
        golden = GoldenGate({spec.alias: spec.golden for spec in self._config.models})
        spend = self._spend_ledger()
        resilience = Resilience(self._config, spend=spend, golden=golden)
        # the decision log is written by its own thread: a slow disk never stalls the event loop
        log_path = self._config.gateway.decisions_log
        sink = BackgroundWriter(JsonlFile(log_path), name="decision-log") if log_path else None

        def refreshed(snapshot: ClusterSnapshot, now: float) -> None:
            metrics.replicas(snapshot, now)
            metrics.resilience(resilience.view())
            if sink is not None:
                metrics.decision_log(failed=sink.failures, dropped=sink.dropped)

        self._poller = BoardPoller(
            get_or_create_board(),
            period_s=telemetry.poll_period_s,
            max_age_s=telemetry.max_age_s,
            watermarks_for=self._config.watermarks_for,
            on_refresh=refreshed,
        )
        loop = asyncio.get_running_loop()
        self._poll_task = loop.create_task(self._poller.run())
        backend = ServeHandleBackend(self._handles)
        self._golden_task = loop.create_task(golden.run(backend))
        providers = {
            p.name: provider_for(p, on_headers=resilience.observe_rate_limits)
            for p in self._config.cloud.providers
            if p.enabled
        }
        if self._config.resilience.probes:
            self._probe_task = loop.create_task(self._prober(backend, providers, resilience).run())
        exchange = get_or_create_exchange()
        replica_id = uuid.uuid4().hex
        sync = BreakerSync(
            resilience.breakers,
            ray_swap(exchange),
            replica_id,
            period_s=self._config.resilience.share_period_s,
            resets_since=ray_resets_since(exchange),
        )
        self._sync_task = loop.create_task(sync.run())
        gateway = self._config.gateway
        decisions = DecisionStore(max_records=gateway.decisions_kept, sink=sink, max_bytes=gateway.decisions_max_bytes)
        learning = Learning.from_config(self._config)  # quality per bucket, feedback, typing
        # schema checks and contract derives: per-tenant admission, fair hand-over (serve_apps/check_pool.py)
        checks = RequestChecks.from_settings(gateway.checks.workers, gateway.checks.per_tenant, auth=gateway.auth)
        if learning.quality is not None:
            metrics.registry.register(QualityCollector(learning.quality))
        dispatcher = Dispatcher(
            self._config,
            backend,
            providers,
            self._poller.latest,
            decisions=decisions,
            observer=learning.observer(metrics),
            resilience=resilience,
            traffic=(parts := traffic_parts(self._config, backend, providers, metrics, replica_id)).traffic,
            sessions=self._sessions(backend, replica_id),
            quality=learning.quality,
            checks=checks.schemas,
        )
        self._traffic_task = loop.create_task(parts.traffic.run(self._config.traffic.sync_period_s, asyncio.sleep))
        idem = self._config.resilience.idempotency
        store = IdempotencyStore(
            ttl_s=idem.ttl_s, max_entries=idem.max_entries, max_bytes=idem.max_bytes, clock=time.monotonic
        )
        limits = TenantLimits(spend.recent_tenant_totals if spend is not None else None)
        # The Serve proxy sets x-request-id on every response and hands us the same id.
        http = GatewayHTTP(
            backend,
            models,
            created=self._created,
            set_request_id=False,
            snapshot=self._poller.latest,
            dispatcher=parts.tiered(dispatcher, limits),  # a pending ticket counts against its tenant's limits
            default_deadline_s=self._config.admission.queue_timeout_s,
            policy=self._config.policy,
            decisions=dispatcher.decisions,
            metrics=metrics,
            authenticator=authenticator_for(self._config, os.environ),
            request_timeout_s=gateway.request_timeout_s,
            idempotent=IdempotentReplies(store, wait_s=idem.wait_s),
            ops=OpsRoutes(resilience, on_reset=exchange.reset.remote, forget=parts.traffic.forget),
            max_body_bytes=gateway.max_body_bytes,
            http_limits=gateway.http_limits,
            redact=client_redactions(self._config, socket.gethostname()),
            golden=golden,
            tenant_limits=limits,
            traffic=parts.routes,
            learning=LearningRoutes(learning, dispatcher.decisions),
            routes=[ServedRoute(r.alias, tuple(r.targets)) for r in self._config.routes],
            checks=checks,
        )
        return http.app
