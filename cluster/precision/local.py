"""The precision a vLLM-CPU engine of a model would run in on *this* machine (cluster/precision/choice.py's
choice with what this node knows): its CPU, the model's own bf16 sensitivity in its float32 reference,
a bf16 failure recorded here before, and one the project measured for the model on this CPU class
(cluster/precision/known.py). The model replica applies it before its engine starts
(serve_apps/engine/startup.py); `spillover capacity` uses it for the KV arithmetic (float32 holds half
the tokens of bf16 in the same memory)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cluster.config.numerics import NumericsSettings
from cluster.hardware.cpu_caps import CpuCaps, read_cpu_caps
from cluster.models import compile_cache_dir
from cluster.precision.choice import Precision, PrecisionChoice, choose
from cluster.precision.known import known_bf16_failure
from cluster.precision.memory import PrecisionMemory
from cluster.precision.numerics_check import judge
from cluster.precision.numerics_reference import load_reference


def model_bf16_verdict(reference: Mapping[str, Any] | None, numerics: NumericsSettings | None) -> str | None:
    """Why the model's own bf16 (the reference implementation's) departs too far from its float32, or None."""
    if reference is None or numerics is None or not reference.get("bf16"):
        return None
    got = [row["token_ids"] for row in reference["bf16"]]
    verdict = judge(
        reference, got, first_tokens=numerics.first_tokens, min_agreeing=numerics.min_agreeing_bf16, label="bf16"
    )
    if verdict.routable:
        return None
    return "the model's own bf16 (transformers) departs from its float32: " + verdict.reason.split(": ", 1)[-1]


def precision_memory(source: str, caps: CpuCaps, engine_version: str) -> PrecisionMemory:
    return PrecisionMemory(compile_cache_dir().parent / "precision", source, caps, engine_version)


def engine_version() -> str:
    try:
        from importlib.metadata import version

        return version("vllm-cpu")
    except Exception:  # noqa: BLE001 - not installed (a GPU host, a test): any stable string keys the memory
        return "unknown"


def local_choice(
    precision: Precision,
    engine_args: Mapping[str, Any],
    source: str,
    numerics: NumericsSettings | None,
    caps: CpuCaps | None = None,
) -> tuple[PrecisionChoice, CpuCaps, PrecisionMemory]:
    """The choice on this machine (its caps read here unless given), and where a bf16 failure is kept."""
    caps = caps or read_cpu_caps()
    folder = Path(source)
    reference = load_reference(folder) if folder.is_dir() else None
    version = engine_version()
    memory = precision_memory(source, caps, version)
    failed = (
        known_bf16_failure(reference, caps, version) or model_bf16_verdict(reference, numerics) or memory.bf16_failed()
    )
    return choose(precision, engine_args, caps, failed), caps, memory
