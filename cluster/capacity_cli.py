"""`spillover capacity`: how many concurrent sequences each configured model's replica can hold.

    spillover capacity [--config configs/gpu.yaml] [--prompt-tokens 512] [--output-tokens 256]
                       [--prefix-share 0.0] [--gpu-mem 80GiB] [--overhead 2GiB] [--json]

For each model in the config: find its shape (a prepared model's config.json, a local folder's
config.json, or a built-in shape for the Qwen2.5-7B / Llama-3.1-8B hub ids), apply the engine's
dtype / kv_cache_dtype, then run `cluster.capacity.plan_capacity` and print every step.

* accelerator gpu: GPU memory is `--gpu-mem`, else the smallest GPU NVML reports here. With no
  GPU and no `--gpu-mem` the model is listed as "no_gpu" (exit status stays 0).
* accelerator cpu: the KV budget is the model's `kv_cache_space_gib` (VLLM_CPU_KVCACHE_SPACE).

Exit status: 0 (also when a shape is unknown or no GPU is found), 2 for a bad config or arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, TextIO

from cluster.capacity import CapacityReport, format_bytes, parse_bytes, plan_capacity
from cluster.config import DEFAULT_GPU_MEMORY_UTILIZATION, ModelSpec, load_config
from cluster.model_shape import LLAMA_3_1_8B, QWEN2_5_7B, ModelShape, load_model_shape
from cluster.models import CATALOG, is_prepared, model_dir
from cluster.nvml import GpuInventory, GpuReader, PynvmlReader
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


def _byte_size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


def add_capacity_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `spillover capacity` on the CLI's subparsers; its handler is `cmd_capacity`."""
    parser = subparsers.add_parser("capacity", help="predict concurrent sequences per model replica (KV memory)")
    parser.add_argument("--config", default=None, help="deployment config (default configs/local.yaml)")
    parser.add_argument("--prompt-tokens", type=_count(0), default=512, help="mean prompt tokens (default 512)")
    parser.add_argument("--output-tokens", type=_count(0), default=256, help="mean output tokens (default 256)")
    parser.add_argument(
        "--prefix-share", type=_share, default=0.0, help="fraction of the prompt shared by all sequences (0..1)"
    )
    parser.add_argument("--gpu-mem", type=_byte_size, default=None, help="GPU memory per GPU, e.g. 80GiB (else NVML)")
    parser.add_argument(
        "--overhead",
        type=_byte_size,
        default=DEFAULT_GPU_OVERHEAD,
        help=f"GPU non-KV overhead (default {DEFAULT_GPU_OVERHEAD})",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=cmd_capacity)
    return parser


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
    spec: ModelSpec, args: argparse.Namespace, gpu_mem: int | None
) -> tuple[str, list[str], CapacityReport | None]:
    """(status, notes, report) for one model: "ok", "unknown_shape", "no_gpu" or "invalid" (notes say why)."""
    try:
        return _plan_model(spec, args, gpu_mem)
    except ValueError as exc:  # e.g. gpu_memory_utilization 1.5, or zero-token sequences
        return "invalid", [str(exc)], None


def _plan_model(
    spec: ModelSpec, args: argparse.Namespace, gpu_mem: int | None
) -> tuple[str, list[str], CapacityReport | None]:
    shape, origin = resolve_shape(spec)
    if shape is None:
        return "unknown_shape", [origin], None
    engine = spec.engine_args
    try:
        shape = shape.with_dtypes(engine.get("dtype"), engine.get("kv_cache_dtype"))
    except ValueError as exc:
        return "unknown_shape", [f"{origin}: {exc}"], None
    block_size = int(engine.get("block_size") or (CPU_BLOCK_SIZE if spec.runs_vllm_cpu else GPU_BLOCK_SIZE))
    common: dict[str, Any] = {
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "prefix_share": args.prefix_share,
        "block_size": block_size,
        "num_gpu_blocks": engine.get("num_gpu_blocks_override"),
    }
    notes = [f"shape: {origin}"]
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
        report = plan_capacity(shape, gpu_mem, util, overhead_bytes=args.overhead, **common)
        tp = int(engine.get("tensor_parallel_size", 1) or 1)
        if tp > 1:
            notes.append(f"tensor_parallel_size {tp} is not modelled: numbers are for one GPU holding the whole model")
    if common["num_gpu_blocks"] is not None:
        notes.append("KV budget from engine_args.num_gpu_blocks_override")
    max_num_seqs = engine.get("max_num_seqs")
    if isinstance(max_num_seqs, int) and max_num_seqs < report.predicted_max_concurrency:
        notes.append(f"engine_args.max_num_seqs = {max_num_seqs} caps running sequences below the KV prediction")
    return "ok", notes + list(report.notes), report


def _gpu_memory(
    config_needs_gpu: bool, args: argparse.Namespace, reader: GpuReader | None
) -> tuple[int | None, str, GpuInventory | None]:
    if args.gpu_mem is not None:
        return args.gpu_mem, f"{format_bytes(args.gpu_mem)} per GPU (--gpu-mem)", None
    if not config_needs_gpu:
        return None, "not needed (CPU models only)", None
    own = reader is None
    gpu_reader: GpuReader = reader if reader is not None else PynvmlReader()
    try:
        inventory = gpu_reader.read()
    finally:
        if own and isinstance(gpu_reader, PynvmlReader):
            gpu_reader.close()
    smallest = inventory.smallest()
    if smallest is None:
        what = "no GPU found" if inventory.state == "no_gpus" else "GPUs could not be read"
        return None, f"{what} ({inventory.reason}); pass --gpu-mem 80GiB for a prediction", inventory
    name = f"GPU {smallest.index} {smallest.name}"
    text = f"{format_bytes(smallest.memory_total)} per GPU (NVML: {name}, smallest of {len(inventory.gpus)})"
    return smallest.memory_total, text, inventory


def cmd_capacity(args: argparse.Namespace, *, gpu_reader: GpuReader | None = None, out: TextIO | None = None) -> int:
    """Handler of `spillover capacity`. `gpu_reader` replaces NVML (tests), `out` stdout."""
    out = out or sys.stdout
    config_path = args.config
    if config_path is None:
        from cluster.cli import default_config_path  # cli imports this module: import at call time

        config_path = default_config_path()
    config = load_config(config_path)
    needs_gpu = any(m.accelerator == "gpu" for m in config.models)
    gpu_mem, gpu_text, inventory = _gpu_memory(needs_gpu, args, gpu_reader)
    rows = []
    for spec in config.models:
        status, notes, report = plan_model(spec, args, gpu_mem)
        rows.append((spec, status, notes, report))
    if args.json:
        result = {
            "config": str(config_path),
            "inputs": {
                "prompt_tokens": args.prompt_tokens,
                "output_tokens": args.output_tokens,
                "prefix_share": args.prefix_share,
                "overhead_bytes": args.overhead,
            },
            "gpu": {
                "memory_bytes": gpu_mem,
                "message": gpu_text,
                "inventory": inventory.to_dict() if inventory else None,
            },
            "models": [
                {
                    "alias": spec.alias,
                    "source": spec.source,
                    "accelerator": spec.accelerator,
                    "status": status,
                    "notes": notes,
                    "report": report.to_dict() if report else None,
                    "steps": [list(step) for step in report.steps()] if report else [],
                }
                for spec, status, notes, report in rows
            ],
        }
        out.write(json.dumps(result, indent=2) + "\n")
        return 0
    out.write(
        f"spillover capacity: {config_path}  (prompt {args.prompt_tokens} tokens, output {args.output_tokens}, "
        f"prefix share {args.prefix_share})\n"
    )
    if needs_gpu or args.gpu_mem is not None:
        out.write(f"GPU memory: {gpu_text}\n")
    for spec, status, notes, report in rows:
        out.write(f"\n{spec.alias}  [{spec.accelerator}, {spec.source}]\n")
        if report is None:
            out.write(f"  {status}: {notes[0]}\n")
            continue
        out.write(_table(report))
        out.writelines(f"  note: {line}\n" for line in notes)
        out.write(
            f"  => admission limit {report.admission_limit} concurrent sequences "
            f"(predicted max {report.predicted_max_concurrency}, bound: {report.bound})\n"
        )
    return 0


def _table(report: CapacityReport) -> str:
    steps = [(label, f"{value:,}", how) for label, value, how in report.steps()]
    label_w = max(len(label) for label, _, _ in steps)
    value_w = max(len(value) for _, value, _ in steps)
    lines = [f"  {'step':<{label_w}}  {'value':>{value_w}}  arithmetic"]
    lines += [f"  {label:<{label_w}}  {value:>{value_w}}  {how}" for label, value, how in steps]
    return "\n".join(lines) + "\n"
