"""One `models[]` entry of the deployment config: a local model, its engine and how it is served."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import Field, ValidatorFunctionWrapHandler, field_validator, model_validator

from cluster.config.base import StrictModel
from cluster.config.numerics import NumericsSettings
from cluster.config.perf import PerfSection, distinct_machines, fit_for, one_or_many
from cluster.config.resilience import GoldenProbe
from cluster.tool_parsers import tool_call_problem
from router.routing.watermarks import Watermarks

PREPARED_PREFIX = "prepared:"
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default `gpu_memory_utilization`
DEFAULT_GOLDEN_PROMPT = "What is the capital of France?"
DEFAULT_GOLDEN_EXPECT = "paris"


class ModelSpec(StrictModel):
    alias: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$", description="the `model` name clients use")
    source: str = Field(description="prepared:<catalog name>, a local folder with config.json, or a hub id")
    family: Literal["qwen", "llama"] = Field(description="model family")
    accelerator: Literal["cpu", "gpu", "gpu-sim"] = Field(
        "cpu",
        description="cpu: vLLM-CPU; gpu: vLLM on CUDA; gpu-sim: vLLM-CPU placed by Ray on num_gpus simulated GPUs "
        "(SPILLOVER_FAKE_NVML), GPU routing without a GPU",
    )
    replicas: int = Field(1, ge=1, description="Serve replicas of the model")
    num_cpus: float = Field(1, gt=0, description="Ray logical CPUs per replica")
    num_gpus: int = Field(1, ge=0, description="GPUs per replica (gpu and gpu-sim accelerators)")
    kv_cache_space_gib: int = Field(2, ge=1, description="vLLM-CPU (cpu, gpu-sim): VLLM_CPU_KVCACHE_SPACE in whole GiB")
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        validate_default=True,
        description="vLLM engine and frontend arguments; unknown names are rejected; enable_prefix_caching is "
        "always true; enable_auto_tool_choice: true with a tool_call_parser (one of vLLM's) takes tool calls locally "
        "(docs/routing.md)",
    )
    precision: Literal["auto", "bfloat16", "float32"] = Field(
        "auto",
        description="vLLM-CPU (cpu, gpu-sim): auto chooses bfloat16 compiled on CPUs with native bf16 (AMX-BF16 or "
        "AVX512-BF16) unless bf16 failed the numerics check on that CPU before (or the project measured it "
        "failing for the model on that CPU class: cluster/precision/known.py), float32 otherwise "
        "(docs/dtype.md); an explicit engine_args.dtype wins",
    )
    numerics: NumericsSettings | None = Field(
        default_factory=NumericsSettings,
        description="each replica checks its engine's greedy tokens against the model's float32 reference "
        "(written by `spillover models prepare`) before it takes traffic and every interval_s; null: no check",
    )
    stall_s: float | None = Field(
        None,
        gt=0,
        description="an engine holding requests that takes no step for this long is wedged: its replica kills it "
        "(Serve replaces the replica) and its requests fail over; null: 30 s, or 20 x the fitted worst step time "
        "when that is longer",
    )
    degenerate_check: bool = Field(
        True,
        description="flag greedy answers cut at max_tokens that end in a repeated phrase as output failures "
        "(they feed health); off for models whose text is noise",
    )
    watermarks: Watermarks | None = Field(None, description="this model's own watermarks; null: the global ones")
    admission_limit: int | None = Field(
        None,
        ge=1,
        description="concurrent requests per replica the gateway admits (set it from bench calibrate); null: "
        "admission.fraction of the maximum predicted from the engine's KV blocks; with `perf` that has an SLO, "
        "the gateway computes the limit from the live workload instead and this value is not used",
    )
    perf: list[PerfSection] = Field(
        default_factory=list,
        description="fitted compute model (bench calibrate --fit-shapes), or a list of them, one per CPU class and "
        "precision (each fit's `cpu` and `precision`): with the SLO of the first fit that describes every replica, "
        "the admission limit becomes min(memory bound, compute bound) for the live workload and requests spill by "
        "deadline; null, or no fit for the replicas' machine: uncalibrated, memory bound only",
    )
    golden: GoldenProbe | None = Field(
        default_factory=lambda: GoldenProbe(prompt=DEFAULT_GOLDEN_PROMPT, expect=DEFAULT_GOLDEN_EXPECT),
        description="a prompt with a known answer: each gateway replica routes to the model only after it answered "
        "this right at start-up, and health L3 re-asks it every correctness_probe_s; null: neither (models whose "
        "text is noise, such as synthetic weights)",
    )
    replica_router: Literal["power_of_two", "prefix_affinity"] = Field(
        "prefix_affinity",
        description="with several replicas, which one takes a request: power_of_two (Ray Serve's default) or "
        "prefix_affinity (the prompt's first prefix_chars characters rank the replicas by rendezvous hashing, so "
        "a shared system prompt lands where it is cached; saturated replicas are left out)",
    )
    imbalanced_threshold: float = Field(
        4, ge=0, description="prefix_affinity: queue-length spread above which power-of-two decides instead"
    )
    prefix_chars: int = Field(2000, ge=1, description="prefix_affinity: prompt characters that key a request")

    @field_validator("perf", mode="wrap")
    @classmethod
    def _perf_one_or_many(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return one_or_many(value, handler)

    @field_validator("perf")
    @classmethod
    def _perf_distinct(cls, value: list[PerfSection]) -> list[PerfSection]:
        distinct_machines(value)
        return value

    def fit_for(self, machines: Iterable[tuple[str | None, str | None]]) -> tuple[PerfSection | None, str | None]:
        """The fit (`perf`) for replicas on these (CPU class, precision), or None and why (cluster/config/perf.py)."""
        return fit_for(self.perf, machines)

    @property
    def has_slo(self) -> bool:
        """A fit with an SLO: the gateway admits by the compute bound where it describes the replicas."""
        return any(fit.has_slo for fit in self.perf)

    @field_validator("engine_args")
    @classmethod
    def _engine_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        value = {"enable_prefix_caching": True, **value}
        if value["enable_prefix_caching"] is not True:
            raise ValueError("enable_prefix_caching must be true: the gateway relies on prefix caching")
        max_len = value.get("max_model_len")
        if max_len is not None and (not isinstance(max_len, int) or max_len < 16):
            raise ValueError("max_model_len must be an integer >= 16")
        util = value.get("gpu_memory_utilization")
        if util is not None and (isinstance(util, bool) or not isinstance(util, int | float) or not 0 < util <= 1):
            raise ValueError("gpu_memory_utilization must be a number in (0, 1]")
        if (problem := tool_call_problem(value)) is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _one_precision(self) -> ModelSpec:
        if self.precision != "auto" and "dtype" in self.engine_args:
            raise ValueError(
                f"precision is {self.precision} and engine_args.dtype is {self.engine_args['dtype']}: set one of them"
            )
        return self

    @property
    def runs_vllm_cpu(self) -> bool:
        """The engine is vLLM-CPU (also for gpu-sim, whose GPUs are simulated)."""
        return self.accelerator != "gpu"

    @property
    def uses_gpus(self) -> bool:
        return self.accelerator != "cpu" and self.num_gpus > 0

    @property
    def gpu_reserved_fraction(self) -> float | None:
        """What the engine reserves of each of its GPUs at start (None: it has no GPU)."""
        if not self.uses_gpus:
            return None
        return float(self.engine_args.get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION))

    @property
    def is_prepared_source(self) -> bool:
        return self.source.startswith(PREPARED_PREFIX)

    @property
    def prepared_name(self) -> str:
        return self.source[len(PREPARED_PREFIX) :]
