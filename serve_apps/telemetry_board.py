"""TelemetryBoard: the named Ray actor replicas push engine stats to and the gateway reads.

Detached and found by name (`get_or_create_board`), so it outlives whichever process created
it first and works the same under `spillover serve`, `serve run` and `serve deploy`.
`Running.stop()` (serve_apps.runner) kills it; a `ray stop` removes it too.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.actor import ActorHandle

BOARD_NAME = "spillover-telemetry"
BOARD_NAMESPACE = "spillover"


@ray.remote(num_cpus=0, max_concurrency=64)  # type: ignore[call-overload]  # an actor option Ray's stubs omit
class TelemetryBoard:
    """Latest stats dict per replica id; replicas not heard from in `forget_after_s` vanish."""

    def __init__(self, forget_after_s: float = 60.0) -> None:
        self._latest: dict[str, dict[str, Any]] = {}
        self._forget_after_s = forget_after_s

    def push(self, stats: dict[str, Any]) -> None:
        self._latest[stats["replica_id"]] = stats

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        cutoff = now - self._forget_after_s
        self._latest = {k: v for k, v in self._latest.items() if v["read_at"] >= cutoff}
        return list(self._latest.values())


HEAD_NODE = {"node:__internal_head__": 0.001}  # Ray's marker resource of the head node


def get_or_create_board() -> ActorHandle:
    """On the head node: a worker node can leave (scale-in, failure) and would take the board with it."""
    return TelemetryBoard.options(  # type: ignore[attr-defined]
        name=BOARD_NAME, namespace=BOARD_NAMESPACE, get_if_exists=True, lifetime="detached", resources=HEAD_NODE
    ).remote()


def kill_board() -> None:
    try:
        ray.kill(ray.get_actor(BOARD_NAME, namespace=BOARD_NAMESPACE))
    except ValueError:
        pass  # never created
