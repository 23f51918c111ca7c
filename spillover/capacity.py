"""`spillover capacity`: how many concurrent sequences each configured model's replica can hold.

    spillover capacity [--config configs/gpu.yaml] [--prompt-tokens 512] [--output-tokens 256]
                       [--prefix-share 0.0] [--gpu-mem 80GiB] [--overhead 2GiB]
                       [--slo-e2e-p95-s S] [--slo-ttft-p95-s S] [--json]

For each model in the config: the plan of cluster/capacity/plan.py, every step printed, then the
admission limit min(memory bound, compute bound) of cluster/capacity/bound.py with the bound that
binds; the compute bound needs the model's fitted `perf` and an SLO (the flags, else perf's own).

* accelerator gpu: GPU memory is `--gpu-mem`, else the smallest GPU NVML reports here. With no
  GPU and no `--gpu-mem` the model is listed as "no_gpu" (exit status stays 0).
* accelerator cpu: the KV budget is the model's `kv_cache_space_gib` (VLLM_CPU_KVCACHE_SPACE).

Exit status: 0 (also when a shape is unknown or no GPU is found), 2 for a bad config or arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TextIO

from cluster.capacity.bound import AdmissionPlan, plan_admission
from cluster.capacity.compute_model import Workload
from cluster.capacity.engine_sim import default_limits
from cluster.capacity.memory import CapacityReport, format_bytes, parse_bytes
from cluster.capacity.plan import DEFAULT_GPU_OVERHEAD, PlanWorkload, plan_model
from cluster.config.deployment import default_config_path, load_config
from cluster.config.model_spec import ModelSpec
from cluster.config.perf import PerfSection
from cluster.hardware.cpu_caps import CpuCaps
from cluster.hardware.nvml import GpuInventory, GpuReader, PynvmlReader
from cluster.models import model_dir
from cluster.precision.local import local_choice


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


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
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
    parser.add_argument(
        "--slo-e2e-p95-s", type=_seconds, default=None, help="end-to-end p95 SLO for the compute bound (s)"
    )
    parser.add_argument(
        "--slo-ttft-p95-s", type=_seconds, default=None, help="time-to-first-token p95 SLO for the compute bound (s)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=cmd_capacity)
    return parser


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


def _local_fit(spec: ModelSpec, caps: CpuCaps | None) -> tuple[PerfSection | None, str | None]:
    """The model's fit for its engine on this machine's CPU and precision, else None and why."""
    source = str(model_dir(spec.prepared_name)) if spec.is_prepared_source else spec.source
    choice, caps, _ = local_choice(spec.precision, spec.engine_args, source, spec.numerics, caps)
    return spec.fit_for([(caps.cpu_class, choice.label)])


def cmd_capacity(
    args: argparse.Namespace,
    *,
    gpu_reader: GpuReader | None = None,
    out: TextIO | None = None,
    cpu_caps: CpuCaps | None = None,
) -> int:
    """Handler of `spillover capacity`. `gpu_reader` replaces NVML (tests), `out` stdout, `cpu_caps` this
    machine's /proc/cpuinfo (the CPU a vLLM-CPU model's precision is chosen for)."""
    out = out or sys.stdout
    config_path = args.config
    if config_path is None:
        config_path = default_config_path()
    config = load_config(config_path)
    needs_gpu = any(m.accelerator == "gpu" for m in config.models)
    gpu_mem, gpu_text, inventory = _gpu_memory(needs_gpu, args, gpu_reader)
    rows = []
    for spec in config.models:
        workload = PlanWorkload(args.prompt_tokens, args.output_tokens, args.prefix_share, args.overhead)
        status, notes, report = plan_model(spec, workload, gpu_mem, cpu_caps)
        admission = None
        perf: PerfSection | None = None
        mismatch: str | None = None
        if spec.perf:  # a GPU model's fit has no CPU class to tell: its first
            perf, mismatch = _local_fit(spec, cpu_caps) if spec.runs_vllm_cpu else (spec.perf[0], None)
        if mismatch is not None:  # never a fit from another CPU or precision silently applied (nor by the gateway)
            notes = [*notes, f"compute bound off on this machine: {mismatch} (run bench calibrate here)"]
        if report is not None:
            mix = Workload(args.prompt_tokens, max(1, args.output_tokens), args.prefix_share)
            gib = gpu_mem / 2**30 if gpu_mem and spec.accelerator != "cpu" else None
            admission = plan_admission(
                perf,
                report.admission_limit,
                mix,
                slo_e2e_p95_s=args.slo_e2e_p95_s,
                slo_ttft_p95_s=args.slo_ttft_p95_s,
                limits=default_limits(spec.accelerator, spec.engine_args, gib),
                unfitted="the fit is from another CPU or precision" if mismatch else None,
            )
        rows.append((spec, status, notes, report, admission))
    if args.json:
        result = {
            "config": str(config_path),
            "inputs": {
                "prompt_tokens": args.prompt_tokens,
                "output_tokens": args.output_tokens,
                "prefix_share": args.prefix_share,
                "overhead_bytes": args.overhead,
                "slo_e2e_p95_s": args.slo_e2e_p95_s,
                "slo_ttft_p95_s": args.slo_ttft_p95_s,
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
                    "admission_limit": admission.admission_limit if admission else None,
                    "bound": admission.bound if admission else None,
                    "report": report.to_dict() if report else None,
                    "steps": [list(step) for step in report.steps()] if report else [],
                    "admission": admission.to_dict() if admission else None,
                }
                for spec, status, notes, report, admission in rows
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
    for spec, status, notes, report, admission in rows:
        out.write(f"\n{spec.alias}  [{spec.accelerator}, {spec.source}]\n")
        if report is None or admission is None:
            out.write(f"  {status}: {notes[0]}\n")
            continue
        out.write(_table(_memory_rows(report) + admission.steps()))
        out.writelines(f"  note: {line}\n" for line in [*notes, *admission.notes])
        out.write(
            f"  => admission limit {admission.admission_limit} concurrent sequences (memory "
            f"{admission.memory_limit} of a KV max {report.predicted_max_concurrency}, compute "
            f"{_compute_text(admission)}; bound: {admission.bound})\n"
        )
    return 0


def _compute_text(admission: AdmissionPlan) -> str:
    if admission.compute is None:
        return "no SLO given" if admission.status == "no_slo" else admission.status
    return "≥ the memory bound" if admission.compute.concurrency is None else str(admission.compute.concurrency)


def _memory_rows(report: CapacityReport) -> list[tuple[str, int | float, str]]:
    """The KV arithmetic; its last row, ⌊fraction × max⌋, is the memory bound of the final min."""
    rows = report.steps()
    _, value, how = rows[-1]
    return [*rows[:-1], ("memory bound", value, how.replace(" (bound: memory)", ""))]


def _table(rows: list[tuple[str, int | float, str]]) -> str:
    steps = [(label, f"{value:,}", how) for label, value, how in rows]
    label_w = max(len(label) for label, _, _ in steps)
    value_w = max(len(value) for _, value, _ in steps)
    lines = [f"  {'step':<{label_w}}  {'value':>{value_w}}  arithmetic"]
    lines += [f"  {label:<{label_w}}  {value:>{value_w}}  {how}" for label, value, how in steps]
    return "\n".join(lines) + "\n"
