"""The dispatcher's interfaces: what it returns (`Dispatched`) and whom it tells
(`DispatchObserver`). What it calls: serve_apps/backend.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from router.burst import Route
from router.decision import DecisionRecord
from serve_apps.backend import BackendReply


@dataclass(frozen=True)
class Dispatched:
    reply: BackendReply
    route: Route
    target: str  # Target.endpoint: local:<alias> | cloud:<provider>
    reason: str
    waited_s: float
    headers: Mapping[str, str] = field(default_factory=dict)


class DispatchObserver(Protocol):
    """What the dispatcher reports (serve_apps.metrics.GatewayMetrics implements it)."""

    def waiting(self, model: str, count: int) -> None: ...

    def waited(self, model: str, seconds: float, outcome: str) -> None: ...

    def decided(self, seconds: float) -> None: ...

    def recorded(self, record: DecisionRecord) -> None: ...


class NoObserver:
    def waiting(self, model: str, count: int) -> None:
        return None

    def waited(self, model: str, seconds: float, outcome: str) -> None:
        return None

    def decided(self, seconds: float) -> None:
        return None

    def recorded(self, record: DecisionRecord) -> None:
        return None
