"""The gateway: Ray Serve ingress deployment every client calls.

It holds one DeploymentHandle per configured model and serves `GatewayHTTP`'s ASGI app
(built at replica start through Serve's `__serve_build_asgi_app__` hook).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from cluster.config import parse_config
from cluster.models import CATALOG
from cluster.telemetry import ClusterSnapshot
from router.auth import authenticator_for
from router.decision import DecisionStore
from router.providers import OpenAICompatProvider
from router.saturation import Saturation, replica_saturation
from serve_apps.board_poller import BoardPoller
from serve_apps.dispatch import Dispatcher
from serve_apps.gateway_http import GatewayHTTP, ServedModel
from serve_apps.local_backend import ServeHandleBackend
from serve_apps.logs import configure_json_logs
from serve_apps.metrics import GatewayMetrics
from serve_apps.telemetry_board import get_or_create_board


class JsonlAppender:
    """Appends one line per call to a file (the decision log)."""

    def __init__(self, path: str) -> None:
        self._path = path

    def __call__(self, line: str) -> None:
        with open(self._path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


@serve.deployment(name="SpilloverGateway", max_ongoing_requests=1000)
@serve.ingress()
class Gateway:
    def __init__(self, config: dict[str, Any], handles: dict[str, DeploymentHandle]) -> None:
        self._config = parse_config(config, "(deployed config)")
        self._handles = handles
        self._created = int(time.time())

    def _saturations(self, snapshot: ClusterSnapshot, now: float) -> dict[str, tuple[str, Saturation]]:
        return {
            r.replica_id: (
                r.model,
                replica_saturation(r, self._config.watermarks_for(r.model), snapshot=snapshot, now=now),
            )
            for r in snapshot.replicas
        }

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
        self._poller = BoardPoller(
            get_or_create_board(),
            period_s=telemetry.poll_period_s,
            max_age_s=telemetry.max_age_s,
            on_refresh=lambda snapshot, now: metrics.replicas(snapshot, self._saturations(snapshot, now)),
        )
        self._poll_task = asyncio.get_running_loop().create_task(self._poller.run())
        backend = ServeHandleBackend(self._handles)
        providers = {p.name: OpenAICompatProvider(p) for p in self._config.cloud.providers if p.enabled}
        gateway = self._config.gateway
        sink = JsonlAppender(gateway.decisions_log) if gateway.decisions_log else None
        decisions = DecisionStore(max_records=gateway.decisions_kept, sink=sink)
        dispatcher = Dispatcher(
            self._config, backend, providers, self._poller.latest, decisions=decisions, observer=metrics
        )
        # The Serve proxy sets x-request-id on every response and hands us the same id.
        http = GatewayHTTP(
            backend,
            models,
            created=self._created,
            set_request_id=False,
            snapshot=self._poller.latest,
            dispatcher=dispatcher,
            default_deadline_s=self._config.admission.queue_timeout_s,
            policy=self._config.policy,
            decisions=dispatcher.decisions,
            metrics=metrics,
            authenticator=authenticator_for(self._config, os.environ),
            request_timeout_s=gateway.request_timeout_s,
        )
        return http.app
