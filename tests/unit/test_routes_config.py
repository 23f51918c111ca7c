"""`routes:` in the config: valid routes (cloud-only, local first then cloud) and hostile ones, each
refused before anything starts with the route's field path and a reason a person can act on."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.config.deployment import parse_config
from router.errors import ConfigError
from router.routing.capabilities import Registry

CAPS = {"snapshot": "s-1", "context_window": 8192, "region": "us", "price_in_per_mtok": 0.1, "price_out_per_mtok": 0.4}
MODEL = {"alias": "m", "source": "prepared:x", "family": "llama", "engine_args": {"max_model_len": 4096}}


def providers(enabled_b: bool = True, local: bool = True) -> list[dict[str, Any]]:
    """Provider a serves `chat`; b serves `chat` and, with `local`, burst for the local model m."""
    b_models = {"chat": {**CAPS, "name": "b-chat"}} | ({"m": {**CAPS, "name": "b-m"}} if local else {})
    return [
        {"name": "a", "base_url": "http://127.0.0.1:1/v1", "models": {"chat": {**CAPS, "name": "a-chat"}}},
        {
            "name": "b",
            "type": "anthropic",
            "base_url": "http://127.0.0.1:2/v1",
            "enabled": enabled_b,
            "models": b_models,
        },
    ]


def config(routes: list[dict[str, Any]], models: list[dict[str, Any]] | None = None, **extra: Any) -> Any:
    models = [MODEL] if models is None else models
    raw = {"models": models, "cloud": {"providers": providers(local=bool(models))}, "routes": routes}
    return parse_config({**raw, **extra}, "routes.yaml")


def refused(routes: list[dict[str, Any]], models: list[dict[str, Any]] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        config(routes, models)
    assert caught.value.path == "routes.yaml"
    return caught.value.message


def test_a_cloud_only_config_needs_no_local_model() -> None:
    cfg = config([{"alias": "chat", "targets": ["cloud:a/chat", "cloud:b/chat"]}], models=[])
    assert cfg.models == [] and cfg.served_names == ["chat"]
    registry = Registry.from_config(cfg.models, cfg.cloud.providers, routes=cfg.routes)
    assert [t.id for t in registry.for_alias("chat")] == ["cloud:a/chat", "cloud:b/chat"]
    assert registry.local_model("chat") == "chat" and registry.route_order("chat") == ("cloud:a/chat", "cloud:b/chat")


def test_a_mixed_route_lists_the_local_model_first_and_serves_under_its_name() -> None:
    cfg = config([{"alias": "chat", "targets": ["local:m", "cloud:b/chat", "cloud:a/chat"]}])
    registry = Registry.from_config(cfg.models, cfg.cloud.providers, routes=cfg.routes)
    assert [t.id for t in registry.for_alias("chat")] == ["local:m", "cloud:b/chat", "cloud:a/chat"]
    assert registry.local_model("chat") == "m" and registry.local_model("m") == "m"
    assert cfg.served_names == ["m", "chat"]


def test_targets_of_a_disabled_provider_are_left_out() -> None:
    raw = {"models": [], "cloud": {"providers": providers(enabled_b=False, local=False)}}
    cfg = parse_config({**raw, "routes": [{"alias": "chat", "targets": ["cloud:b/chat", "cloud:a/chat"]}]}, "t")
    registry = Registry.from_config(cfg.models, cfg.cloud.providers, routes=cfg.routes)
    assert [t.id for t in registry.for_alias("chat")] == ["cloud:a/chat"]


def test_nothing_to_serve_is_refused() -> None:
    assert "nothing to serve" in refused([], models=[])


@pytest.mark.parametrize(
    ("routes", "needle"),
    [
        ([{"alias": "chat", "targets": []}], "routes[0].targets: List should have at least 1 item"),
        ([{"alias": "chat", "targets": ["cloud:a/nope"]}], "routes[0].targets[0]: 'cloud:a/nope' names no configured"),
        ([{"alias": "chat", "targets": ["cloud:zz/chat"]}], "names no configured model or provider entry"),
        ([{"alias": "chat", "targets": ["local:ghost"]}], "routes[0].targets[0]: 'local:ghost' names no configured"),
        ([{"alias": "chat", "targets": ["gpt-4o"]}], "'gpt-4o' is not a target id (local:<model alias> or cloud:"),
        ([{"alias": "chat", "targets": ["cloud:a/chat", "cloud:a/chat"]}], "routes[0].targets[1]: 'cloud:a/chat' is "),
        ([{"alias": "chat", "targets": ["chat"]}], "names a route (itself: a cycle)"),
        ([{"alias": "chat", "targets": ["local:chat"]}], "names a route (itself: a cycle)"),
        (
            [{"alias": "x", "targets": ["y"]}, {"alias": "y", "targets": ["route:x"]}],
            "routes do not nest, so they cannot loop",
        ),
        ([{"alias": "m", "targets": ["cloud:a/chat"]}], "routes[0].alias: 'm' is also a models[] alias"),
        (
            [{"alias": "chat", "targets": ["cloud:a/chat"]}, {"alias": "chat", "targets": ["cloud:b/chat"]}],
            "routes[1].alias: 'chat' names another route too",
        ),
        ([{"alias": "chat", "targets": ["cloud:a/chat", "local:m"]}], "the local model must come first"),
        ([{"alias": "bad alias!", "targets": ["cloud:a/chat"]}], "routes[0].alias: String should match pattern"),
        ([{"alias": "chat", "targets": ["cloud:a/chat"], "fallback": "x"}], "routes[0].fallback: Extra inputs"),
        ([{"alias": "chat", "targets": "cloud:a/chat"}], "routes[0].targets: Input should be a valid list"),
        ([{"alias": "chat", "targets": [f"cloud:a/{i}" for i in range(65)]}], "at most 64 items"),
    ],
)
def test_hostile_routes_are_refused_with_path_and_reason(routes: list[dict[str, Any]], needle: str) -> None:
    assert needle in refused(routes)


def test_two_local_models_in_one_route_are_refused() -> None:
    second = {**MODEL, "alias": "m2"}
    message = refused([{"alias": "chat", "targets": ["local:m", "local:m2"]}], models=[MODEL, second])
    assert "routes[0].targets: more than one local model" in message


def test_a_cloud_entry_without_capabilities_is_refused_in_a_route() -> None:
    raw = {
        "models": [],
        "cloud": {"providers": [{"name": "a", "base_url": "http://127.0.0.1:1/v1", "models": {"chat": "gpt-x"}}]},
        "routes": [{"alias": "chat", "targets": ["cloud:a/chat"]}],
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, "t")
    assert "is a bare model name, so its capabilities are unknown" in caught.value.message


def test_a_provider_entry_neither_a_model_nor_routed_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        config([{"alias": "chat", "targets": ["cloud:b/chat"]}], models=[])
    # a/chat is named by no route (and is no local model's burst target)
    assert "cloud provider 'a' maps unknown model aliases ['chat']" in caught.value.message
    assert "named by a route (cloud:a/<key>)" in caught.value.message


def test_an_unknown_target_error_lists_a_bounded_number_of_known_ids() -> None:
    many = {f"k{i}": {**CAPS, "name": f"n{i}"} for i in range(30)}
    raw = {
        "models": [MODEL],
        "cloud": {"providers": [{"name": "a", "base_url": "http://127.0.0.1:1/v1", "models": many}]},
        "routes": [{"alias": "chat", "targets": ["cloud:a/nope" + "x" * 5000, *(f"cloud:a/k{i}" for i in range(30))]}],
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, "t")
    message = caught.value.message
    assert "(23 more)" in message and len(message) < 1500


def test_a_scenario_s_route_order_is_route_or_strategy() -> None:
    with pytest.raises(ConfigError) as caught:
        config([], policy={"scenarios": {"default": {"route_order": "random"}}})
    assert "policy.scenarios.default.route_order: Input should be 'route' or 'strategy'" in caught.value.message


def test_a_cloud_only_config_builds_the_gateway_alone() -> None:
    from serve_apps.app import build_app  # Ray Serve's application graph; nothing is started

    cfg = config([{"alias": "chat", "targets": ["cloud:a/chat", "cloud:b/chat"]}], models=[])
    app = build_app(cfg, "routes.yaml")
    embedded, handles = app._bound_deployment.init_args
    assert handles == {} and embedded["models"] == [] and app._bound_deployment.name == "SpilloverGateway"


def test_each_problem_is_reported_at_its_own_field_path() -> None:
    with pytest.raises(ConfigError) as caught:
        config([{"alias": "chat", "targets": ["cloud:a/chat", "cloud:a/nope", "chat"]}])
    assert [path for path, _ in caught.value.problems] == ["routes[0].targets[1]", "routes[0].targets[2]"]
    assert "(top level)" not in caught.value.message
