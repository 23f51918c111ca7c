"""The pin table as a named, detached Ray actor on the head node, shared by every gateway replica
(the table and the replicas' cache: serve_apps/sessions/pins.py). `Running.stop()` kills it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import ray
from ray.actor import ActorHandle

from serve_apps.head_actor import on_head
from serve_apps.sessions.history import GetHistory, HistoryStore, Messages, PutHistory, Stored
from serve_apps.sessions.pins import Get, PinTable, Put, Record, SetAnchor

PINS_NAME = "spillover-session-pins"
PINS_NAMESPACE = "spillover"
HISTORY_NAME = "spillover-session-history"


def get_or_create_pins(ttl_s: float, max_sessions: int) -> ActorHandle:
    """The shared table (the first replica to ask creates it with its config's bounds)."""
    # one call at a time: `record` is a compare-and-set (each call takes microseconds)
    actor: Any = ray.remote(num_cpus=0)(PinTable)
    return on_head(actor, PINS_NAME, PINS_NAMESPACE, time.time, ttl_s, max_sessions)


def get_or_create_history(ttl_s: float, total_bytes: int) -> ActorHandle:
    """The shared store of sessions' turns (`sessions.store`)."""
    actor: Any = ray.remote(num_cpus=0)(HistoryStore)
    return on_head(actor, HISTORY_NAME, PINS_NAMESPACE, time.time, ttl_s, total_bytes)


def kill_pins() -> None:
    for name in (PINS_NAME, HISTORY_NAME):
        try:
            ray.kill(ray.get_actor(name, namespace=PINS_NAMESPACE))
        except ValueError:
            pass  # never created


def ray_history(actor: ActorHandle) -> tuple[GetHistory, PutHistory]:
    async def get(key: str) -> Stored:
        return await actor.get.remote(key)

    async def put(key: str, messages: Messages, label: Mapping[str, Any]) -> None:
        await actor.put.remote(key, messages, label)

    return get, put


def ray_pins(actor: ActorHandle) -> tuple[Get, Put, SetAnchor]:
    async def get(key: str) -> Record | None:
        return await actor.get.remote(key)

    async def put(
        key: str, expected: str | None, target: str, anchor: Mapping[str, Any] | None, label: Mapping[str, Any]
    ) -> Record:
        return await actor.record.remote(key, expected, target, anchor, label)

    async def set_anchor(key: str, target: str, anchor: Mapping[str, Any], label: Mapping[str, Any]) -> bool:
        return bool(await actor.set_anchor.remote(key, target, anchor, label))

    return get, put, set_anchor
