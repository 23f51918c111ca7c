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
instead of waiting for ever. An operator's command that needs one (`command_call`: a traffic command, a
resilience reset) answers 503 `cluster_state_unavailable` when it is hung or gone, never a 500 or a wait
without end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from ray.actor import ActorHandle
from ray.exceptions import RayError

from router.error_codes import ErrorCode
from router.errors import TargetUnavailable

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


async def command_call(ref: Awaitable[T], what: str, timeout_s: float = HEAD_CALL_TIMEOUT_S) -> T:
    """`call` on an operator's command: `what` (the actor, in words) hung or gone is a TargetUnavailable (503)
    with code cluster_state_unavailable, which says the command may or may not have taken effect."""
    try:
        return await call(ref, timeout_s)
    except TimeoutError:
        why = f"did not answer within {timeout_s:g}s"
    except RayError as exc:
        why = f"is unavailable ({type(exc).__name__})"
    raise TargetUnavailable(
        f"{what}, an actor on the head node, {why}: the command may or may not have taken effect; "
        "read the state again before retrying",
        code=ErrorCode.CLUSTER_STATE_UNAVAILABLE,
    )
