"""Deployment config: one YAML file per deployment, validated by pydantic v2.

`load_config(path)` returns a frozen `SpilloverConfig` or raises `ConfigError` naming the
file, each failing field path (`models[0].engine_args.max_model_len`) and the reason —
before anything is started. Unknown keys are errors, so a typo never silently falls back
to a default.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from cluster.config.base import FieldProblems, StrictModel, no_duplicates
from cluster.config.cloud import CloudSection
from cluster.config.gateway import GatewayAutoscaling, GatewaySection, StateSection, Tenant
from cluster.config.learning import LearningSection
from cluster.config.model_spec import ModelSpec
from cluster.config.resilience import ResilienceSection, SpendSection
from cluster.config.routes import RouteSpec, route_problems
from cluster.config.session import SessionsSection
from cluster.config.traffic import TrafficSection
from router.errors import ConfigError
from router.routing.capabilities import cloud_id
from router.routing.local_share import LocalShareSettings
from router.routing.policy import Policy
from router.routing.watermarks import Watermarks

__all__ = ["GatewayAutoscaling", "GatewaySection", "SpilloverConfig", "Tenant", "load_config", "parse_config"]

DEFAULT_CONFIG = "configs/local.yaml"  # the embedded default: `spillover serve` without --config


class ClusterSection(StrictModel):
    num_cpus: int | None = Field(
        8,
        ge=1,
        description="logical CPUs of a local Ray started by `spillover serve` (more than the physical cores, so that "
        "replicas schedule); null: Ray's count",
    )
    num_gpus: int | None = Field(
        None,
        ge=0,
        description="GPUs a local Ray started by `spillover serve` declares (simulated ones for gpu-sim models, "
        "configs/gpu-sim.yaml); null: Ray's count",
    )
    address: str | None = Field(
        None,
        description="Ray address to connect to (auto: a running cluster) instead of starting one. Without it "
        "`spillover serve` always starts a new local Ray: `RAY_ADDRESS` and the address file `ray start` leaves "
        "(/tmp/ray/ray_current_cluster) are not used",
    )


class TelemetrySection(StrictModel):
    """The direct engine-stats path (router/routing/snapshot.py)."""

    poll_period_s: float = Field(
        0.2,
        gt=0,
        le=5,
        description="the most often the gateway takes a new reading of the replicas' engine stats "
        "(a push of news answers its watch at once; idle, every two periods)",
    )
    max_age_s: float = Field(1.0, gt=0, description="older replica stats are stale (counted as saturated)")


class AdmissionSection(StrictModel):
    """Gateway-enforced admission (router/routing/burst.py, serve_apps/dispatch/dispatcher.py)."""

    mean_prompt_tokens: int = Field(512, ge=1, description="for the computed admission limit")
    mean_output_tokens: int = Field(256, ge=1, description="for the computed admission limit")
    fraction: float = Field(
        0.8,
        gt=0,
        le=1,
        description="admission limit = fraction x max concurrent sequences predicted from the engine's KV blocks",
    )
    queue_max: int = Field(64, ge=0, description="requests per model that may wait for local room")
    queue_timeout_s: float = Field(30, gt=0, description="longest wait for local room without x-spillover-deadline-ms")
    deadline_spill: bool = Field(
        True,
        description="where a model's perf (with its fit matching the replicas' CPU and precision) predicts a request "
        "would finish locally after its deadline (x-spillover-deadline-ms, else the scenario's deadline_ms, else "
        "perf.slo_e2e_p95_s), a request that may burst goes to the cloud at once, and at the admission limit one "
        "predicted to finish in time waits for local room (router/routing/deadline.py); false: the limit alone",
    )
    local_share: LocalShareSettings = Field(
        LocalShareSettings(),
        description="load-proportional spill (router/routing/local_share.py): the share of burstable requests kept "
        "local, cut after a window of slow or failing local answers and raised after a good one; a policy to compare "
        "(bench replay), off by default",
    )
    lease_ttl_s: float = Field(
        10,
        ge=1,
        le=300,
        description="an admitted request's lease on its model's limit, in the shared store, renewed by its gateway "
        "replica every third of this: a replica that dies gives its admissions back within it",
    )


class SpilloverConfig(StrictModel):
    version: Literal[1] = Field(1, description="config format")
    cluster: ClusterSection = Field(ClusterSection(), description="the Ray cluster: started here, or one to connect to")
    gateway: GatewaySection = Field(GatewaySection(), description="the OpenAI-compatible gateway every client calls")
    watermarks: Watermarks = Field(
        Watermarks(), description="burst thresholds of every model without its own models[].watermarks"
    )
    telemetry: TelemetrySection = Field(
        TelemetrySection(), description="the direct engine-stats path from the replicas to the gateway"
    )
    admission: AdmissionSection = Field(
        AdmissionSection(), description="how many requests local replicas get, and how long the others wait"
    )
    policy: Policy = Field(Policy(), description="business scenarios (x-business-scenario) and scorer weights")
    models: list[ModelSpec] = Field(
        default_factory=list,
        description="the local models, each served by vLLM replicas; may be empty when routes serve every name "
        "from the cloud (no engine is started then)",
    )
    cloud: CloudSection = Field(CloudSection(), description="cloud providers requests may burst to")
    routes: list[RouteSpec] = Field(
        default_factory=list,
        description="model names served by an ordered list of targets (local and/or cloud), see docs/routing.md#routes",
    )
    tenants: list[Tenant] = Field(
        default_factory=list, description="clients of the gateway and their keys (needed with gateway.auth)"
    )
    resilience: ResilienceSection = Field(
        ResilienceSection(), description="retries, circuit breakers, health, idempotency and their sharing"
    )
    spend: SpendSection = Field(SpendSection(), description="the cloud spend ledger and the soft monthly budget")
    traffic: TrafficSection = Field(
        TrafficSection(), description="operator traffic controls, graded switches and deferred requests"
    )
    sessions: SessionsSection = Field(SessionsSection(), description="conversations pinned to a target, and switches")
    learning: LearningSection = Field(
        LearningSection(), description="quality learned from outcomes and feedback, request typing"
    )
    state: StateSection = Field(
        StateSection(), description="the shared store of the gateway replicas' cross-request state"
    )

    @model_validator(mode="after")
    def _replicas_share_a_store(self) -> SpilloverConfig:
        gateway = self.gateway
        most = gateway.autoscaling.max_replicas if gateway.autoscaling is not None else gateway.replicas
        if most > 1 and self.state.url is None:
            field = "gateway.autoscaling.max_replicas" if gateway.autoscaling is not None else "gateway.replicas"
            raise FieldProblems(
                [
                    (
                        "state.url",
                        f"{field} is {most} but state.url is not set: each gateway replica would admit, limit "
                        "and remember on its own. Set state.url to the Redis every replica reaches "
                        "(redis://HEAD:6380/0: ray-cluster.yaml starts one on the head) or to 'local' on one "
                        f"machine, or set {field} to 1",
                    )
                ]
            )
        return self

    @model_validator(mode="after")
    def _typing_scenarios_known(self) -> SpilloverConfig:
        unknown = self.learning.unknown_scenarios(self.policy)
        if unknown:
            raise ValueError(f"learning.typing names scenarios the policy lacks: {unknown}")
        return self

    @field_validator("tenants")
    @classmethod
    def _unique_tenants(cls, value: list[Tenant]) -> list[Tenant]:
        no_duplicates([t.name for t in value], "tenant names")
        return value

    @model_validator(mode="after")
    def _auth_needs_tenants(self) -> SpilloverConfig:
        if self.gateway.auth and not self.tenants:
            raise ValueError("gateway.auth is on but no tenants are configured")
        return self

    @model_validator(mode="after")
    def _summariser_is_local(self) -> SpilloverConfig:
        name = self.sessions.compress.summariser
        if name is not None and self.model(name) is None:
            raise ValueError(f"sessions.compress.summariser {name!r} is not one of the models' aliases")
        return self

    @field_validator("models")
    @classmethod
    def _unique_aliases(cls, value: list[ModelSpec]) -> list[ModelSpec]:
        no_duplicates([m.alias for m in value], "model aliases")
        return value

    @model_validator(mode="after")
    def _something_served(self) -> SpilloverConfig:
        if not self.models and not self.routes:
            raise ValueError("nothing to serve: configure models (local) or routes (cloud and/or local)")
        return self

    @model_validator(mode="after")
    def _routes_valid(self) -> SpilloverConfig:
        entries = {p.name: p.models for p in self.cloud.providers}
        problems = route_problems(self.routes, (m.alias for m in self.models), entries)
        if problems:
            raise FieldProblems(problems)
        return self

    @model_validator(mode="after")
    def _cloud_models_known(self) -> SpilloverConfig:
        """A provider's model key is a local model alias (its burst target) or named by a route."""
        aliases = {m.alias for m in self.models}
        routed = {t for r in self.routes for t in r.targets}
        problems = []
        for i, provider in enumerate(self.cloud.providers):
            keys = provider.models
            unknown = sorted(k for k in keys if k not in aliases and cloud_id(provider.name, k) not in routed)
            if unknown:
                problems.append(
                    (
                        f"cloud.providers[{i}].models",
                        f"cloud provider {provider.name!r} maps unknown model aliases {unknown}: each key is a "
                        f"models[] alias or named by a route (cloud:{provider.name}/<key>); "
                        f"configured: {sorted(aliases)}",
                    )
                )
        if problems:
            raise FieldProblems(problems)
        return self

    @model_validator(mode="after")
    def _idle_engine_below_gpu_watermark(self) -> SpilloverConfig:
        """An engine reserves gpu_memory_utilization of each GPU at start: a watermark at or below
        that reads an idle replica as saturated, so every request would leave (or wait)."""
        for i, spec in enumerate(self.models):
            reserved = spec.gpu_reserved_fraction
            if reserved is None:
                continue
            marks, where = (
                (spec.watermarks, f"models[{i}].watermarks.gpu_memory")
                if spec.watermarks
                else (self.watermarks, "watermarks.gpu_memory")
            )
            if reserved >= marks.gpu_memory:
                raise ValueError(
                    f"models[{i}].engine_args.gpu_memory_utilization {reserved:g} >= {where} {marks.gpu_memory:g}: "
                    f"vLLM reserves that much of each GPU when the engine starts, so an idle replica would read "
                    f"as saturated; set {where} above it (e.g. {min(1.0, reserved + 0.05):g}: the free-memory floor "
                    f"is 1 - {where}) or lower gpu_memory_utilization"
                )
        return self

    def route(self, alias: str) -> RouteSpec | None:
        return next((r for r in self.routes if r.alias == alias), None)

    @property
    def served_names(self) -> list[str]:
        """Every `model` name clients may use: local models, then routes."""
        return [m.alias for m in self.models] + [r.alias for r in self.routes]

    def model(self, alias: str) -> ModelSpec | None:
        return next((m for m in self.models if m.alias == alias), None)

    def watermarks_for(self, alias: str) -> Watermarks:
        spec = self.model(alias)
        return spec.watermarks if spec and spec.watermarks else self.watermarks


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(top level)"


def parse_config(data: Any, source: str) -> SpilloverConfig:
    """Validate an already-parsed mapping; `source` names it in errors."""
    if not isinstance(data, dict):
        raise ConfigError(source, [("(top level)", "expected a mapping of sections")])
    try:
        return SpilloverConfig.model_validate(data)
    except ValidationError as exc:
        problems: list[tuple[str, str]] = []
        for err in exc.errors():
            cause = err.get("ctx", {}).get("error")
            problems += cause.problems if isinstance(cause, FieldProblems) else [(_field_path(err["loc"]), err["msg"])]
        raise ConfigError(source, problems) from None


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), [("(file)", exc.strerror or str(exc))]) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        raise ConfigError(str(path), [(where, f"not valid YAML: {getattr(exc, 'problem', exc)}")]) from None


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def apply_overlay(data: dict[str, Any], overlay: Any, source: str) -> dict[str, Any]:
    """Merge an overlay (e.g. the one `bench calibrate` writes) into raw config data.

    `models` entries are matched by `alias` and merged field by field; other sections merge
    as nested mappings. An overlay naming a model the config does not have is an error.
    """
    if not isinstance(overlay, dict):
        raise ConfigError(source, [("(top level)", "an overlay must be a mapping")])
    overlay = dict(overlay)
    models = overlay.pop("models", [])
    merged = _deep_merge(data, overlay)
    if models:
        by_alias = {m.get("alias"): i for i, m in enumerate(merged.get("models", [])) if isinstance(m, dict)}
        merged_models = list(merged.get("models", []))
        for i, entry in enumerate(models):
            alias = entry.get("alias") if isinstance(entry, dict) else None
            if alias not in by_alias:
                reason = f"model alias {alias!r} is not in the config ({', '.join(map(str, by_alias))})"
                raise ConfigError(source, [(f"models[{i}].alias", reason)])
            merged_models[by_alias[alias]] = _deep_merge(merged_models[by_alias[alias]], entry)
        merged["models"] = merged_models
    return merged


def load_config(path: str | Path, overlays: Sequence[str | Path] = ()) -> SpilloverConfig:
    """Read and validate a YAML config file, with optional overlays merged in order."""
    path = Path(path)
    data = _read_yaml(path)
    for overlay in overlays:
        if not isinstance(data, dict):
            break
        data = apply_overlay(data, _read_yaml(Path(overlay)), str(overlay))
    source = " + ".join([str(path), *map(str, overlays)])
    return parse_config(data, source)


def dump_config(config: SpilloverConfig) -> dict[str, Any]:
    """A plain dict (JSON/YAML-safe) that `parse_config` turns back into `config`."""
    return config.model_dump(mode="json")


def default_config_path() -> str:
    """configs/local.yaml from the working directory, else the copy next to the package."""
    if Path(DEFAULT_CONFIG).is_file():
        return DEFAULT_CONFIG
    return str(Path(str(resources.files("cluster"))).parent / DEFAULT_CONFIG)
