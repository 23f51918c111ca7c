"""Build the Ray Serve application: one LLMServer deployment per model + the gateway.

Importable for Ray's own CLI as well:

    serve run serve_apps.app:app_builder config=configs/local.yaml
"""

from __future__ import annotations

from typing import Any, cast

from ray.serve.deployment import Application, Deployment
from ray.serve.llm import build_llm_deployment

from cluster.config.deployment import SpilloverConfig, dump_config, load_config, parse_config
from serve_apps.engine.llm import check_engine_args, llm_config_for, resolve_source
from serve_apps.engine.llm_server import SpilloverLLMServer
from serve_apps.gateway import Gateway


def check_deployable(config: SpilloverConfig, config_path: str = "(config)") -> None:
    """Raise ConfigError for what would only fail at deploy time (unknown engine args)."""
    check_engine_args(config, config_path)
    for index, spec in enumerate(config.models):
        if not spec.is_prepared_source:
            resolve_source(spec, config_path, index)


def build_app(config: SpilloverConfig, config_path: str = "(config)") -> Application:
    """The whole application for `config`; raises ConfigError for a bad config."""
    check_engine_args(config, config_path)
    handles = {}
    for index, spec in enumerate(config.models):
        source = resolve_source(spec, config_path, index)
        llm_config = llm_config_for(spec, source, config.watermarks_for(spec.alias))
        handles[spec.alias] = build_llm_deployment(llm_config, deployment_cls=SpilloverLLMServer)
    scaling = config.gateway.autoscaling
    replicas: dict[str, Any] = (
        {"autoscaling_config": scaling.model_dump()} if scaling else {"num_replicas": config.gateway.replicas}
    )
    actor: dict[str, Any] = {"num_cpus": config.gateway.num_cpus}
    if config.gateway.resources:  # places the replicas (and their direct_port) on the nodes that declare them
        actor["resources"] = dict(config.gateway.resources)
    gateway = cast(Deployment, Gateway).options(ray_actor_options=actor, **replicas)
    return gateway.bind(dump_config(config), handles)


def app_builder(args: dict[str, Any]) -> Application:
    """Entry point for `serve run serve_apps.app:app_builder config=PATH` and for the Serve
    config file `spillover render` writes (`config_data`: the embedded, validated config)."""
    if "config_data" in args:
        source = str(args.get("config_source", "(embedded config)"))
        return build_app(parse_config(args["config_data"], source), source)
    path = str(args.get("config", "configs/local.yaml"))
    return build_app(load_config(path), path)
