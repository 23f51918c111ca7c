"""Ray's own OpenAI ingress in front of *our* model replicas — the baseline of `bench overhead`.

`ray.serve.llm.build_openai_app` would build a second LLMServer per model (a second engine), so
the comparison would mix two replicas. Instead this deploys Ray's `OpenAiIngress` (the class
`build_openai_app` uses) as a separate Serve application, `ray-openai` at `/ray`, bound to
DeploymentHandles of the LLMServer deployments spillover already runs. Requests through
`/ray/v1/...`, through our gateway (`/v1/...`) and straight to a handle then share the engine,
and their latency difference is the ingress layer alone.

`OpenAiIngress` and `make_fastapi_ingress` live under `ray.llm._internal` (Ray 2.60 here): a
Ray upgrade may move them, and then this says so instead of guessing.
"""

from __future__ import annotations

from typing import Any, cast

from ray import serve
from ray.serve.deployment import Deployment
from ray.serve.handle import DeploymentHandle

from cluster.config.deployment import SpilloverConfig
from cluster.render import APP_NAME
from router.errors import ClusterError
from serve_apps.engine.llm import llm_config_for, resolve_source

RAY_INGRESS_APP = "ray-openai"
RAY_INGRESS_PREFIX = "/ray"


def model_handles(config: SpilloverConfig, app_name: str = APP_NAME) -> dict[str, DeploymentHandle]:
    """DeploymentHandles of the running LLMServer deployments, by model alias."""
    status = serve.status().applications.get(app_name)
    if status is None:
        raise ClusterError(f"no Serve application {app_name!r} is running (start it with `spillover serve`)")
    handles = {}
    for spec in config.models:
        names = [d for d in status.deployments if d.endswith(spec.alias) and "LLMServer" in d]
        if not names:
            raise ClusterError(f"application {app_name!r} has no LLMServer deployment for {spec.alias!r}")
        handles[spec.alias] = serve.get_deployment_handle(names[0], app_name=app_name)
    return handles


def deploy_ray_ingress(config: SpilloverConfig, *, config_path: str = "(config)") -> str:
    """Deploy Ray's OpenAiIngress over the running model replicas; returns its route prefix."""
    try:
        from ray.llm._internal.serve.core.configs.openai_api_models import to_model_metadata
        from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress, make_fastapi_ingress
    except ImportError as exc:
        raise ClusterError(
            f"this Ray has no OpenAiIngress where Ray 2.60 keeps it ({exc}); see serve_apps/engine/ray_ingress.py"
        ) from None
    handles = model_handles(config)
    cards: dict[str, Any] = {}
    for index, spec in enumerate(config.models):
        llm_config = llm_config_for(spec, resolve_source(spec, config_path, index), config.watermarks_for(spec.alias))
        cards[spec.alias] = to_model_metadata(spec.alias, llm_config)
    ingress = cast(
        Deployment,
        serve.deployment(
            make_fastapi_ingress(OpenAiIngress),
            name="RayOpenAiIngress",
            num_replicas=1,
            ray_actor_options={"num_cpus": config.gateway.num_cpus},
        ),
    )
    serve.run(
        ingress.bind(llm_deployments=handles, model_cards=cards),
        name=RAY_INGRESS_APP,
        route_prefix=RAY_INGRESS_PREFIX,
    )
    return RAY_INGRESS_PREFIX


def remove_ray_ingress() -> None:
    if RAY_INGRESS_APP in serve.status().applications:
        serve.delete(RAY_INGRESS_APP)
