"""The dispatcher's interfaces: what it returns (`Dispatched`), whom it tells (`DispatchObserver`),
what the HTTP layer calls (`Dispatch`; `LocalDispatch` without burst). What it calls: serve_apps/backend.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from router.learning.decision import DecisionRecord
from router.request.contract import RequestContract
from router.request.engine_fields import engine_body
from router.request.openai_request import Kind
from router.routing.burst import Route
from router.routing.capabilities import local_id
from serve_apps.backend import BackendReply, ModelBackend


@dataclass(frozen=True)
class Dispatched:
    reply: BackendReply
    route: Route
    target: str  # Target.endpoint: local:<alias> | cloud:<provider>
    reason: str
    waited_s: float
    headers: Mapping[str, str] = field(default_factory=dict)
    status: int = 200  # 202: deferred (serve_apps/traffic/deferral.py), the body is its ticket


class DispatchObserver(Protocol):
    """What the dispatcher reports (serve_apps.telemetry.metrics.GatewayMetrics implements it)."""

    def waiting(self, model: str, count: int) -> None: ...

    def waited(self, model: str, seconds: float, outcome: str) -> None: ...

    def decided(self, seconds: float) -> None: ...

    def recorded(self, record: DecisionRecord) -> None: ...

    def stream_repaired(self, target: str, kind: str) -> None:
        """A stream ended better than its provider sent it (kind: skipped_event, done_missing,
        continued) or could not be continued (not_continued)."""
        ...


class NoObserver:
    def waiting(self, model: str, count: int) -> None:
        return None

    def waited(self, model: str, seconds: float, outcome: str) -> None:
        return None

    def decided(self, seconds: float) -> None:
        return None

    def recorded(self, record: DecisionRecord) -> None:
        return None

    def stream_repaired(self, target: str, kind: str) -> None:
        return None


class Dispatch(Protocol):
    async def dispatch(
        self, kind: Kind, body: dict[str, Any], request_id: str, *, contract: RequestContract, deadline_s: float
    ) -> Dispatched: ...


class LocalDispatch:
    """Everything local, no admission or burst: a gateway without a Dispatcher (tests, tools)."""

    def __init__(self, local: ModelBackend) -> None:
        self._local = local

    async def dispatch(
        self, kind: Kind, body: dict[str, Any], request_id: str, *, contract: RequestContract, deadline_s: float
    ) -> Dispatched:
        reply = await self._local.call(contract.model, kind, engine_body(kind, body), request_id)
        return Dispatched(reply, "local", local_id(contract.model), "local (burst not configured)", 0.0)
