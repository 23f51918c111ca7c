"""The capacity model: how many sequences one replica can hold, step by step.

    kv bytes / token     = 2 (K and V) × num_layers × num_kv_heads × head_dim × bytes(kv dtype)
    kv budget (bytes)    = total_gpu_mem × gpu_memory_utilization − weights − overhead      (source "memory")
                         | VLLM_CPU_KVCACHE_SPACE                                          (source "kv_cache_space")
    kv budget (tokens)   = ⌊kv budget bytes / kv bytes per token⌋, down to whole blocks when block_size is known
                         | num_gpu_blocks × block_size  (vLLM's own number, exact)          (source "engine_blocks")
    tokens / sequence    = prompt × (1 − prefix_share) + output  (the shared prefix is held once, see below)
    max concurrency      = ⌊(kv budget tokens − prompt × prefix_share) / tokens per sequence⌋
    admission limit      = ⌊0.8 × max concurrency⌋, at least 1 when max concurrency ≥ 1
    Little's law         concurrency = throughput × latency
    agent concurrency    = model max QPS × model calls per task × (1 + buffer)

The model's side (kv bytes per token, weights) comes from its `cluster.capacity.model_shape.ModelShape`.
Only memory is modelled here (`CapacityReport.bound == "memory"`); bench adds the compute term
and reports which bound binds. Everything here is pure.
Exact rational arithmetic (`fractions.Fraction`) keeps hand-checked numbers exact.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from decimal import Decimal
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Literal

from cluster.capacity.model_shape import ModelShape, dtype_bytes

KvSource = Literal["memory", "engine_blocks", "kv_cache_space"]
DEFAULT_ADMISSION_FRACTION = 0.8


def _exact(value: float | int) -> Fraction:
    """A decimal-exact rational: 0.9 is 9/10, not the nearest binary float."""
    return Fraction(str(value)) if isinstance(value, float) else Fraction(value)


def kv_budget_from_memory(
    total_gpu_mem_bytes: int, gpu_memory_utilization: float, weights_bytes: int, overhead_bytes: int
) -> int:
    """⌊total × utilization⌋ − weights − overhead, clamped at 0 (bytes left for the KV cache)."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    usable = math.floor(total_gpu_mem_bytes * _exact(gpu_memory_utilization))
    return max(0, usable - weights_bytes - overhead_bytes)


def kv_budget_tokens_from_blocks(num_gpu_blocks: int, block_size: int) -> int:
    """vLLM's exact KV capacity in tokens: num_gpu_blocks × block_size."""
    return num_gpu_blocks * block_size


def kv_budget_tokens_from_bytes(kv_budget_bytes: int, bytes_per_token: int, block_size: int | None = None) -> int:
    """⌊bytes / bytes per token⌋; with a block size, vLLM's whole blocks: ⌊bytes / (bytes/token × block)⌋ × block."""
    if block_size:
        return kv_budget_bytes // (bytes_per_token * block_size) * block_size
    return kv_budget_bytes // bytes_per_token


def tokens_per_sequence(prompt_tokens: int, output_tokens: int, prefix_share: float = 0.0) -> Fraction:
    """Tokens one more sequence adds: prompt × (1 − prefix_share) + output."""
    _check_share(prefix_share)
    return prompt_tokens * (1 - _exact(prefix_share)) + output_tokens


@functools.lru_cache(maxsize=4096)  # exact rationals cost ~0.1 ms; the gateway asks per request, mostly the same
def max_concurrent_sequences(
    kv_budget_tokens: int, prompt_tokens: int, output_tokens: int, prefix_share: float = 0.0
) -> int:
    """How many sequences fit in the KV budget at once.

        shared   = prompt × prefix_share              (a common prefix, held once for all sequences)
        per_seq  = prompt × (1 − prefix_share) + output
        N        = ⌊(kv_budget_tokens − shared) / per_seq⌋, clamped at 0

    With prefix_share = 0 this is ⌊budget / (prompt + output)⌋. It counts every sequence at its
    full length (prompt + all output tokens): the worst case the scheduler must survive.
    """
    per_seq = tokens_per_sequence(prompt_tokens, output_tokens, prefix_share)
    if per_seq <= 0:
        raise ValueError("a sequence must hold at least one token (prompt/output tokens are zero)")
    shared = prompt_tokens * _exact(prefix_share)
    return max(0, math.floor((kv_budget_tokens - shared) / per_seq))


@functools.lru_cache(maxsize=4096)
def admission_limit(predicted: int, fraction: float = DEFAULT_ADMISSION_FRACTION) -> int:
    """⌊fraction × predicted⌋ (80% by default), at least 1 when predicted ≥ 1."""
    if not 0 < fraction <= 1:
        raise ValueError(f"admission fraction must be in (0, 1], got {fraction}")
    if predicted < 1:
        return 0
    return max(1, math.floor(predicted * _exact(fraction)))


def _check_share(prefix_share: float) -> None:
    if not 0 <= prefix_share < 1:
        raise ValueError(f"prefix_share must be in [0, 1), got {prefix_share}")


_BYTES_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]i?b|b)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, **{f"{p}b": 1000 ** (i + 1) for i, p in enumerate("kmgtp")}}
_UNITS.update({f"{p}ib": 1024 ** (i + 1) for i, p in enumerate("kmgtp")})
BYTE_UNITS: Mapping[str, int] = MappingProxyType(_UNITS)
del _UNITS


def parse_bytes(value: str | int) -> int:
    """ "80GiB" (binary), "80GB" (decimal), "81920MiB", "1.5TiB", "1024" or an int → bytes (floored)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected a byte size like 80GiB or an integer, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a byte size cannot be negative: {value}")
        return value
    match = _BYTES_RE.match(value)
    if not match:
        raise ValueError(
            f"not a byte size: {value!r}; write a number with a unit: B, KB/MB/GB/TB (powers of 1000) "
            "or KiB/MiB/GiB/TiB (powers of 1024), e.g. 80GiB"
        )
    return int(Decimal(match.group(1)) * BYTE_UNITS[(match.group(2) or "b").lower()])


def format_bytes(value: int) -> str:
    """1234567890 → "1.15 GiB" (for reading; exact numbers are printed beside it)."""
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value} B"


@dataclass(frozen=True)
class CapacityReport:
    """Every step of one replica's capacity estimate, so a person can redo the arithmetic.

    `bound` names the resource that limits concurrency. Only memory is modelled now; bench
    calibration extends this with a compute/throughput bound and sets it to whichever binds.
    """

    shape: ModelShape
    kv_source: KvSource
    kv_bytes_per_token: int
    kv_budget_bytes: int
    kv_budget_tokens: int
    tokens_per_sequence: float
    shared_prefix_tokens: float
    predicted_max_concurrency: int
    admission_limit: int
    prompt_tokens: int
    output_tokens: int
    prefix_share: float
    weights_bytes: int
    weights_source: Literal["given", "estimated"]
    overhead_bytes: int
    gpu_mem_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    admission_fraction: float = DEFAULT_ADMISSION_FRACTION
    bound: Literal["memory"] = "memory"
    notes: tuple[str, ...] = ()

    @property
    def model(self) -> str:
        return self.shape.name

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "model": self.model, "shape": self.shape.to_dict(), "notes": list(self.notes)}

    def steps(self) -> list[tuple[str, int | float, str]]:
        """(label, value, formula with this report's numbers) for each step, in order."""
        s = self.shape
        rows: list[tuple[str, int | float, str]] = []
        per_token, budget, tokens = self.kv_bytes_per_token, self.kv_budget_bytes, self.kv_budget_tokens
        dims = f"{s.num_layers} layers × {s.num_kv_heads} kv heads × {s.head_dim} head_dim"
        rows.append(("kv bytes per token", per_token, f"2 × {dims} × {dtype_bytes(s.kv_dtype)} B ({s.kv_dtype})"))
        if self.kv_source == "memory":
            mem, weights, overhead = self.gpu_mem_bytes or 0, self.weights_bytes, self.overhead_bytes
            how = (
                f"≈ {s.param_count:,} params × {dtype_bytes(s.dtype)} B" if self.weights_source != "given" else "given"
            )
            budget_how = f"{mem:,} × {self.gpu_memory_utilization} − {weights:,} − {overhead:,}"
            rows.append(("gpu memory", mem, format_bytes(mem)))
            rows.append(("weights", weights, f"{how} = {format_bytes(weights)}"))
            rows.append(("overhead", overhead, f"activations, CUDA graphs, non-torch: {format_bytes(overhead)}"))
            rows.append(("kv budget bytes", budget, f"{budget_how} = {format_bytes(budget)}"))
        elif self.kv_source == "kv_cache_space":
            rows.append(("kv budget bytes", budget, f"VLLM_CPU_KVCACHE_SPACE = {format_bytes(budget)}"))
        if self.kv_source == "engine_blocks":
            rows.append(("kv budget tokens", tokens, f"{self.num_gpu_blocks:,} blocks × {self.block_size} (engine)"))
            rows.append(("kv budget bytes", budget, f"{tokens:,} × {per_token:,} = {format_bytes(budget)}"))
        elif block := self.block_size or 0:
            blocks = f"{tokens // block:,} blocks × {block}"
            rows.append(("kv budget tokens", tokens, f"⌊{budget:,} / ({per_token:,} × {block})⌋ = {blocks}"))
        else:
            rows.append(("kv budget tokens", tokens, f"⌊{budget:,} / {per_token:,}⌋"))
        prompt, output, share = self.prompt_tokens, self.output_tokens, self.prefix_share
        shared, per_seq = _num(self.shared_prefix_tokens), _num(self.tokens_per_sequence)
        n = self.predicted_max_concurrency
        rows.append(("shared prefix tokens", shared, f"{prompt} × {share} (held once)"))
        rows.append(("tokens per sequence", per_seq, f"{prompt} × (1 − {share}) + {output}"))
        rows.append(("max concurrent sequences", n, f"⌊({tokens:,} − {shared}) / {per_seq}⌋"))
        limit = f"⌊{self.admission_fraction} × {n}⌋, at least 1 (bound: {self.bound})"
        rows.append(("admission limit", self.admission_limit, limit))
        return rows


def _num(value: float | Fraction) -> int | float:
    """Whole numbers print without a trailing .0."""
    value = float(value)
    return int(value) if value.is_integer() else round(value, 3)


def plan_capacity(
    shape: ModelShape,
    gpu_mem_bytes: int | None,
    gpu_memory_utilization: float | None,
    prompt_tokens: int,
    output_tokens: int,
    prefix_share: float = 0.0,
    overhead_bytes: int = 0,
    weights_bytes: int | None = None,
    num_gpu_blocks: int | None = None,
    block_size: int | None = None,
    *,
    kv_space_bytes: int | None = None,
    admission_fraction: float = DEFAULT_ADMISSION_FRACTION,
) -> CapacityReport:
    """One replica's capacity. The KV budget comes from, in order of preference:

    * `num_gpu_blocks` × `block_size` — the engine's own number ("engine_blocks");
    * `kv_space_bytes` — a fixed KV space, vLLM-CPU's VLLM_CPU_KVCACHE_SPACE ("kv_cache_space");
    * `gpu_mem_bytes` × `gpu_memory_utilization` − weights − overhead ("memory").

    Weights are `weights_bytes` when given, else estimated from the shape (params × dtype bytes).
    With a `block_size` (and no engine blocks) the token budget is floored to whole blocks, as vLLM does.
    """
    if prompt_tokens < 0 or output_tokens < 0:
        raise ValueError("prompt and output tokens must be >= 0")
    _check_share(prefix_share)
    per_token = shape.kv_bytes_per_token
    weights = shape.weights_bytes if weights_bytes is None else weights_bytes
    notes: list[str] = []
    source: KvSource
    if num_gpu_blocks is not None:
        if not block_size:
            raise ValueError("num_gpu_blocks needs block_size")
        source = "engine_blocks"
        tokens = kv_budget_tokens_from_blocks(num_gpu_blocks, block_size)
        budget = tokens * per_token
    else:
        if kv_space_bytes is not None:
            source, budget = "kv_cache_space", kv_space_bytes
        elif gpu_mem_bytes is not None and gpu_memory_utilization is not None:
            source = "memory"
            budget = kv_budget_from_memory(gpu_mem_bytes, gpu_memory_utilization, weights, overhead_bytes)
            if budget == 0:
                notes.append("weights + overhead do not fit in the usable GPU memory: no room for a KV cache")
        else:
            raise ValueError("give num_gpu_blocks + block_size, kv_space_bytes, or gpu_mem_bytes + utilization")
        tokens = kv_budget_tokens_from_bytes(budget, per_token, block_size)
    predicted = max_concurrent_sequences(tokens, prompt_tokens, output_tokens, prefix_share)
    if tokens and predicted == 0:
        notes.append("one sequence of this length does not fit in the KV budget")
    return CapacityReport(
        shape=shape,
        kv_source=source,
        kv_bytes_per_token=per_token,
        kv_budget_bytes=budget,
        kv_budget_tokens=tokens,
        tokens_per_sequence=float(tokens_per_sequence(prompt_tokens, output_tokens, prefix_share)),
        shared_prefix_tokens=float(prompt_tokens * _exact(prefix_share)),
        predicted_max_concurrency=predicted,
        admission_limit=admission_limit(predicted, admission_fraction),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        prefix_share=prefix_share,
        weights_bytes=weights,
        weights_source="estimated" if weights_bytes is None else "given",
        overhead_bytes=overhead_bytes,
        gpu_mem_bytes=gpu_mem_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        admission_fraction=admission_fraction,
        notes=tuple(notes),
    )
