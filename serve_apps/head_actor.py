"""The cluster's shared actors: one way to find or create each on the head node.

Every actor the gateway replicas share (serve_apps/telemetry/board.py, serve_apps/resilience/breaker_exchange.py,
serve_apps/traffic/board.py, serve_apps/sessions/actor.py) is named in a namespace and detached, so it
outlives whichever process created it first and works the same under `spillover serve`, `serve run`
and `serve deploy`; it runs on the head node, since a worker node can leave (scale-in, failure) and
would take it with it. The first caller creates it with its arguments; every later caller gets that
same actor, and its own arguments are ignored.

Every call to one of them is bounded (`call`): a head actor answers in milliseconds, so one that has not
answered in `HEAD_CALL_TIMEOUT_S` is hung (its node overloaded, its process stopped), and the loop that asked —
the telemetry poll, the breaker and traffic syncs, an engine's stats push — treats it as away (TimeoutError)
instead of waiting for ever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from ray.actor import ActorHandle

T = TypeVar("T")

HEAD_NODE = {"node:__internal_head__": 0.001}  # Ray's marker resource of the head node
HEAD_CALL_TIMEOUT_S = 5.0


def on_head(actor: Any, name: str, namespace: str, *args: Any) -> ActorHandle:
    """The actor of `name` in `namespace`, created from `actor` (a Ray remote class) with `args` on the
    head node if it does not exist yet."""
    placed = actor.options(name=name, namespace=namespace, get_if_exists=True, lifetime="detached", resources=HEAD_NODE)
    handle: ActorHandle = placed.remote(*args)
    return handle


async def call(ref: Awaitable[T], timeout_s: float = HEAD_CALL_TIMEOUT_S) -> T:
    """`await ref` (an actor call's ObjectRef), or TimeoutError after `timeout_s`."""
    return await asyncio.wait_for(ref, timeout_s)
