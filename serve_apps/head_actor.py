"""The cluster's shared actors: one way to find or create each on the head node.

Every actor the gateway replicas share (serve_apps/telemetry/board.py, serve_apps/resilience/breaker_exchange.py,
serve_apps/traffic/board.py, serve_apps/sessions/actor.py) is named in a namespace and detached, so it
outlives whichever process created it first and works the same under `spillover serve`, `serve run`
and `serve deploy`; it runs on the head node, since a worker node can leave (scale-in, failure) and
would take it with it. The first caller creates it with its arguments; every later caller gets that
same actor, and its own arguments are ignored.
"""

from __future__ import annotations

from typing import Any

from ray.actor import ActorHandle

HEAD_NODE = {"node:__internal_head__": 0.001}  # Ray's marker resource of the head node


def on_head(actor: Any, name: str, namespace: str, *args: Any) -> ActorHandle:
    """The actor of `name` in `namespace`, created from `actor` (a Ray remote class) with `args` on the
    head node if it does not exist yet."""
    placed = actor.options(name=name, namespace=namespace, get_if_exists=True, lifetime="detached", resources=HEAD_NODE)
    handle: ActorHandle = placed.remote(*args)
    return handle
