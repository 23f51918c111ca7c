"""The `routes:` section: a model name served by an ordered list of targets (cluster/config/deployment.py
holds the rest).

    routes:
      - alias: chat                       # the `model` name clients use
        targets:                          # tried in this order (router/routing/plan.py), each still filtered by the
          - local:smollm2-135m-instruct   #   request's contract; at most one local model, and first
          - cloud:cloud-sim/chat          # cloud:<provider>/<key of that provider's models>
          - cloud:cloud-anthropic/chat

A target is named by its target id (router/routing/capabilities.py): `local:<models[].alias>` or
`cloud:<provider>/<key>` where `<key>` is a key of that provider's `models`. A route with no local
target is served by the cloud only; a gateway whose config has only such routes starts no engine.

What a config is refused for, each with the route's field path: a route alias that is also a
`models[]` alias (it would shadow the model), two routes of one alias, an empty target list, a
target named twice, a target that names no configured model or provider entry, a target that names
a route (routes do not nest, so they cannot loop), a cloud entry without capabilities (a bare model
name: never routable), and more than one local model or a local model after a cloud target (the burst
decision keeps a request on one local model while it has room; the cloud targets after it are its
fall-over order).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import Field

from cluster.config.base import StrictModel
from router.routing.capabilities import LOCAL_PREFIX, ProviderModel, cloud_id, local_id

CLOUD_PREFIX = "cloud:"
_SHOWN = 8  # known target ids quoted in an "unknown target" error


class RouteSpec(StrictModel):
    alias: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
        max_length=200,
        description="the `model` name clients use; may not be a models[] alias",
    )
    targets: list[str] = Field(
        min_length=1,
        max_length=64,
        description="target ids in fall-over order: local:<models[].alias> (at most one, first) and "
        "cloud:<provider>/<key of its models>; each still filtered by the request's contract",
    )


def route_problems(
    routes: list[RouteSpec],
    model_aliases: Iterable[str],
    provider_models: Mapping[str, Mapping[str, str | ProviderModel]],
) -> list[tuple[str, str]]:
    """(field path, reason) for every problem of `routes` against the configured models and the
    providers' model entries (provider name -> model key -> entry)."""
    models = set(model_aliases)
    locals_ = {local_id(a) for a in models}
    clouds = {cloud_id(p, key): entry for p, entries in provider_models.items() for key, entry in entries.items()}
    route_aliases = [r.alias for r in routes]
    problems: list[tuple[str, str]] = []
    for i, route in enumerate(routes):
        where = f"routes[{i}]"
        if route.alias in models:
            problems.append(
                (
                    f"{where}.alias",
                    f"{route.alias!r} is also a models[] alias: a route may not shadow a local model (rename the "
                    f"route, or list local:{route.alias} among its targets)",
                )
            )
        if route_aliases.count(route.alias) > 1 and route_aliases.index(route.alias) != i:
            problems.append((f"{where}.alias", f"{route.alias!r} names another route too: route aliases are unique"))
        problems += _target_problems(route, where, set(route_aliases), locals_, clouds)
    return problems


def _target_problems(
    route: RouteSpec, where: str, route_aliases: set[str], locals_: set[str], clouds: Mapping[str, object]
) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    seen: set[str] = set()
    local_at: list[int] = []
    for j, target in enumerate(route.targets):
        path = f"{where}.targets[{j}]"
        if target in seen:
            problems.append((path, f"{target!r} is listed twice: each target once, in fall-over order"))
            continue
        seen.add(target)
        named = target.removeprefix(LOCAL_PREFIX).removeprefix("route:")
        if target not in locals_ and target not in clouds and named in route_aliases:
            loop = " (itself: a cycle)" if named == route.alias else " (routes do not nest, so they cannot loop)"
            problems.append((path, f"{target!r} names a route{loop}; list that route's targets instead"))
        elif target in locals_:
            local_at.append(j)
        elif target in clouds:
            if isinstance(clouds[target], str):
                problems.append(
                    (
                        path,
                        f"{target!r} is a bare model name, so its capabilities are unknown and no request could "
                        "be routed there: configure its capabilities in the provider's models",
                    )
                )
        else:
            problems.append((path, _unknown(target, locals_, clouds)))
    if len(local_at) > 1:
        problems.append(
            (
                f"{where}.targets",
                "more than one local model: a route keeps a request on one local model while it has room",
            )
        )
    elif local_at and local_at[0] != 0:
        problems.append(
            (
                f"{where}.targets[{local_at[0]}]",
                "the local model must come first: the cloud targets after it are where its requests burst to",
            )
        )
    return problems


def _unknown(target: str, locals_: set[str], clouds: Mapping[str, object]) -> str:
    known = sorted(locals_) + sorted(clouds)
    shown = ", ".join(known[:_SHOWN]) + (f", ... ({len(known) - _SHOWN} more)" if len(known) > _SHOWN else "")
    if not target.startswith((LOCAL_PREFIX, CLOUD_PREFIX)):
        what = "local:<model alias> or cloud:<provider>/<model key>"
        return f"{target[:100]!r} is not a target id ({what}); known: {shown}"
    return f"{target[:100]!r} names no configured model or provider entry; known: {shown or '(none)'}"
