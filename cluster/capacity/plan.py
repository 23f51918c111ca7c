"""Per model, the capacity plan: the model's shape, the engine's settings, then the KV arithmetic.

For each model: find its shape (a prepared model's config.json, a local folder's config.json, or a
built-in shape for the Qwen2.5-7B / Llama-3.1-8B hub ids), apply the engine's dtype / kv_cache_dtype,
then run `cluster.capacity.memory.plan_capacity`.

* accelerator gpu: the KV budget comes from the GPU's memory × gpu_memory_utilization.
* accelerator cpu (and gpu-sim, whose engine is vLLM-CPU): the model's `kv_cache_space_gib`.

Used by `spillover capacity` and by bench/calibrate/formula.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from cluster.capacity.memory import CapacityReport, plan_capacity
from cluster.capacity.model_shape import LLAMA_3_1_8B, QWEN2_5_7B, ModelShape, load_model_shape
from cluster.config.model_spec import DEFAULT_GPU_MEMORY_UTILIZATION, ModelSpec
from cluster.hardware.cpu_caps import CpuCaps
from cluster.models import CATALOG, is_prepared, model_dir
from cluster.precision.local import local_choice
from router.errors import ConfigError

GIB = 1024**3
DEFAULT_GPU_OVERHEAD = "2GiB"  # rough: activation peak + non-torch memory + CUDA graphs of a 7-8B model
GPU_BLOCK_SIZE = 16  # vLLM's default block size on CUDA
CPU_BLOCK_SIZE = 128  # what vLLM-CPU 0.32 uses (measured: 728 blocks × 128 for SmolLM2 in 2 GiB)

# Hub ids whose shape ships with spillover (the models of configs/gpu.yaml); compared lower-case.
KNOWN_HUB_SHAPES: Mapping[str, tuple[str, Mapping[str, Any]]] = MappingProxyType(
    {
        "qwen/qwen2.5-7b-instruct": ("Qwen2.5-7B", QWEN2_5_7B),
        "qwen/qwen2.5-7b": ("Qwen2.5-7B", QWEN2_5_7B),
        "meta-llama/llama-3.1-8b-instruct": ("Llama-3.1-8B", LLAMA_3_1_8B),
        "meta-llama/llama-3.1-8b": ("Llama-3.1-8B", LLAMA_3_1_8B),
        "meta-llama/meta-llama-3.1-8b-instruct": ("Llama-3.1-8B", LLAMA_3_1_8B),
    }
)


@dataclass(frozen=True)
class PlanWorkload:
    """The sequences to plan for, and the GPU memory set aside beside weights and KV."""

    prompt_tokens: int
    output_tokens: int
    prefix_share: float = 0.0
    overhead_bytes: int = 2 * GIB


def resolve_shape(spec: ModelSpec) -> tuple[ModelShape | None, str]:
    """The model's shape and where it came from, or (None, why it is unknown)."""
    try:
        if spec.is_prepared_source:
            name = spec.prepared_name
            if name not in CATALOG:
                return None, f"unknown prepared model {name!r}; known: {', '.join(sorted(CATALOG))}"
            folder = model_dir(name)
            if not is_prepared(name):
                return None, f"{name} is not prepared ({folder}): run `spillover models prepare {name}`"
            return load_model_shape(folder, name=spec.alias), f"{folder / 'config.json'}"
        folder = Path(spec.source).expanduser()
        if folder.is_dir():
            return load_model_shape(folder, name=spec.alias), f"{folder / 'config.json'}"
        known = KNOWN_HUB_SHAPES.get(spec.source.lower())
        if known:
            return ModelShape.from_hf_config(known[1], name=spec.alias), f"built-in {known[0]} shape"
    except ConfigError as exc:
        return None, exc.message.replace("\n", " ")
    return None, (
        f"shape unknown for {spec.source!r}: point `source` at a local folder with config.json "
        f"(built-in shapes: {', '.join(sorted(KNOWN_HUB_SHAPES))})"
    )


def plan_model(
    spec: ModelSpec, workload: PlanWorkload, gpu_mem: int | None, caps: CpuCaps | None = None
) -> tuple[str, list[str], CapacityReport | None]:
    """(status, notes, report) for one model: "ok", "unknown_shape", "no_gpu" or "invalid" (notes say why).
    `caps`: the CPU a vLLM-CPU engine's precision is chosen for (default: this machine's)."""
    try:
        return _plan_model(spec, workload, gpu_mem, caps)
    except ValueError as exc:  # e.g. gpu_memory_utilization 1.5, or zero-token sequences
        return "invalid", [str(exc)], None


def _plan_model(
    spec: ModelSpec, workload: PlanWorkload, gpu_mem: int | None, caps: CpuCaps | None
) -> tuple[str, list[str], CapacityReport | None]:
    shape, origin = resolve_shape(spec)
    if shape is None:
        return "unknown_shape", [origin], None
    engine = spec.engine_args
    dtype, precision_note = engine.get("dtype"), None
    if spec.runs_vllm_cpu and dtype is None:  # chosen on the CPU the engine runs on: here, as seen from this node
        source = str(model_dir(spec.prepared_name)) if spec.is_prepared_source else spec.source
        choice = local_choice(spec.precision, engine, source, spec.numerics, caps)[0]
        dtype, precision_note = choice.dtype, f"precision on this machine: {choice.label} ({choice.reason})"
    try:
        shape = shape.with_dtypes(dtype, engine.get("kv_cache_dtype"))
    except ValueError as exc:
        return "unknown_shape", [f"{origin}: {exc}"], None
    block_size = int(engine.get("block_size") or (CPU_BLOCK_SIZE if spec.runs_vllm_cpu else GPU_BLOCK_SIZE))
    common: dict[str, Any] = {
        "prompt_tokens": workload.prompt_tokens,
        "output_tokens": workload.output_tokens,
        "prefix_share": workload.prefix_share,
        "block_size": block_size,
        "num_gpu_blocks": engine.get("num_gpu_blocks_override"),
    }
    notes = [f"shape: {home_relative(origin)}"]  # reports are committed: no machine paths
    if precision_note is not None:
        notes.append(home_relative(precision_note))
    if spec.runs_vllm_cpu:
        notes.append(
            f"CPU: the KV budget is kv_cache_space_gib = {spec.kv_cache_space_gib} GiB (VLLM_CPU_KVCACHE_SPACE)"
        )
        report = plan_capacity(shape, None, None, kv_space_bytes=spec.kv_cache_space_gib * GIB, **common)
    else:
        if gpu_mem is None:
            return (
                "no_gpu",
                ["no GPU memory known (see the GPU line): pass --gpu-mem (e.g. 80GiB) for a prediction"],
                None,
            )
        util = float(engine.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION))
        report = plan_capacity(shape, gpu_mem, util, overhead_bytes=workload.overhead_bytes, **common)
        tp = int(engine.get("tensor_parallel_size", 1) or 1)
        if tp > 1:
            notes.append(f"tensor_parallel_size {tp} is not modelled: numbers are for one GPU holding the whole model")
    if common["num_gpu_blocks"] is not None:
        notes.append("KV budget from engine_args.num_gpu_blocks_override")
    max_num_seqs = engine.get("max_num_seqs")
    if isinstance(max_num_seqs, int) and max_num_seqs < report.predicted_max_concurrency:
        notes.append(f"engine_args.max_num_seqs = {max_num_seqs} caps running sequences below the KV prediction")
    return "ok", notes + list(report.notes), report


def home_relative(origin: str) -> str:
    """`origin` with the user's home folder written `~` (a model folder in the cache is a machine path)."""
    home = str(Path.home())
    return "~" + origin[len(home) :] if home not in ("", "/") and origin.startswith(home + "/") else origin
