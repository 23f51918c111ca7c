"""The gateway's admission limit through the fitted compute model (serve_apps/dispatch/admission.py):
it follows the live workload mix, stays within perf's bounds, says which bound and inputs set it,
and uncalibrated models keep the KV-derived limit."""

from __future__ import annotations

from typing import Any, cast

import pytest

from cluster.config.deployment import SpilloverConfig, parse_config
from router.errors import ConfigError
from router.request.contract import RequestContract
from router.routing.burst import BurstInputs, decide
from router.routing.pipeline import PipelineResult
from router.routing.plan import Plan
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from router.routing.watermarks import Watermarks
from serve_apps.dispatch.admission import Admission
from serve_apps.dispatch.interfaces import NoObserver
from serve_apps.dispatch.workload_mix import WorkloadMix

T0 = 1000.0
PERF = {"request_overhead_s": 0.3, "step_s": 0.075, "per_sequence_s": 0.0085, "per_prefill_token_s": 0.0021,
        "tail_e2e": 1.05, "slo_e2e_p95_s": 10}  # fmt: skip


def config(**model: Any) -> SpilloverConfig:
    spec = {"alias": "m", "source": "prepared:x", "family": "llama", **model}
    return parse_config({"models": [spec]}, "test")


def snapshot(replicas: int = 1, hits: int = 0, queries: int = 0) -> ClusterSnapshot:
    stats = tuple(ReplicaStats("m", f"r{i}", "n1", T0, 0.1, 0, 0, queries, hits, 364, 128) for i in range(replicas))
    return ClusterSnapshot(taken_at=T0, replicas=stats, max_age_s=1.0)


def admission(cfg: SpilloverConfig) -> Admission:
    return Admission(cfg, NoObserver(), clock=lambda: T0)


def test_the_limit_follows_the_live_mix_and_names_its_inputs() -> None:
    adm = admission(config(perf=PERF))
    for _ in range(3):
        adm.observe("m", 300, 64)
    limit = adm.limit_with_reason("m", snapshot(), T0)
    # compute: ⌊(10 / 1.05 − 5.1) / (64 × 0.0085 + 300 × 0.0021)⌋ = 3; memory: ⌊0.8 × ⌊46,592 / 364⌋⌋ = 102
    assert limit.value == 3
    assert limit.detail == (
        "compute bound: min(memory 102, compute 3) x 1 replica(s) for e2e p95 <= 10 s at prompt 300, output 64, "
        "prefix 0.00 from the last 3 requests"
    )
    for _ in range(64):  # the window moves on to short requests
        adm.observe("m", 50, 16)
    # ⌊(9.5238 − (0.3 + 16 × 0.075)) / (16 × 0.0085 + 50 × 0.0021)⌋ = ⌊8.0238 / 0.241⌋ = 33
    assert adm.limit("m", snapshot(), T0) == 33
    assert adm.limit("m", snapshot(replicas=2), T0) == 66  # per replica, summed over fresh replicas


def test_prefix_hits_lower_the_prefill_and_the_bounds_clamp() -> None:
    adm = admission(config(perf={**PERF, "max_admission_limit": 4}))
    adm.observe("m", 300, 64)
    # hit rate 0.5: P_u = 150 → ⌊4.4238 / (0.544 + 0.315)⌋ = 5, clamped to 4
    limit = adm.limit_with_reason("m", snapshot(hits=500, queries=1000), T0)
    assert limit.value == 4
    assert "prefix 0.50" in limit.detail and "within perf bounds [1, 4]" in limit.detail
    slow = admission(config(perf={**PERF, "min_admission_limit": 2}))
    slow.observe("m", 300, 512)  # not even one request meets the SLO: compute bound 0, kept at 2
    assert slow.limit("m", snapshot(), T0) == 2


def test_before_any_request_the_configured_means_are_used() -> None:
    adm = admission(config(perf=PERF))
    limit = adm.limit_with_reason("m", snapshot(), T0)
    # 512 and 256, to two significant digits (the inputs the limit is computed from)
    assert "admission.mean_* (no request yet)" in limit.detail and "prompt 510, output 260" in limit.detail


@pytest.mark.parametrize("model", [{}, {"perf": {k: v for k, v in PERF.items() if k != "slo_e2e_p95_s"}}])
def test_uncalibrated_models_keep_the_kv_limit(model: dict[str, Any]) -> None:
    adm = admission(config(**model))
    adm.observe("m", 300, 64)
    limit = adm.limit_with_reason("m", snapshot(), T0)
    # ⌊46,592 / (512 + 256)⌋ = 60; ⌊0.8 × 60⌋ = 48, as before the compute model existed
    assert (limit.value, limit.detail) == (48, "")
    assert admission(config(admission_limit=5, **model)).limit("m", snapshot(), T0) == 5


def test_the_reason_carries_the_bound_and_inputs() -> None:
    adm = admission(config(perf=PERF))
    adm.observe("m", 300, 64)
    limit = adm.limit_with_reason("m", snapshot(), T0)
    inputs = BurstInputs("m", Watermarks(), 3, limit.value, False, ("sim",), admission_detail=limit.detail)
    full = decide(inputs, snapshot(), T0, frozenset())
    assert full.route == "cloud" and full.reason.startswith("inflight 3 >= admission limit 3 (compute bound: min(")
    assert len(full.reason) < 300  # fits x-spillover-reason whole
    room = decide(BurstInputs("m", Watermarks(), 1, 3, False, ("sim",), admission_detail=limit.detail),
                  snapshot(), T0, frozenset())  # fmt: skip
    assert room.route == "local" and "inflight 1 < admission limit 3" in room.reason


def test_workload_mix_window() -> None:
    mix = WorkloadMix(size=2)
    assert mix.mean("m") is None
    for prompt, output in ((100, 10), (200, 20), (300, 30)):
        mix.observe("m", prompt, output)
    got = mix.mean("m")
    assert got is not None and (got.prompt_tokens, got.output_tokens, got.requests) == (250, 25, 2)
    with pytest.raises(ValueError):
        WorkloadMix(size=0)


async def test_the_dispatcher_records_which_bound_set_the_limit() -> None:
    from tests.unit.test_dispatch import CHAT, World, dispatcher, make_config, run

    world = World()
    d = dispatcher(world, make_config(perf=PERF))
    body = {**CHAT, "max_tokens": 64}
    held = await run(d, "chat", {**body, "stream": True}, "r-1")  # one stream in flight
    done = await run(d, "chat", body, "r-2")
    # the mix of 2 requests: a few prompt tokens, 64 out → ⌊(9.5238 − 5.1) / (0.544 + g·P)⌋ = 8 or so
    assert done.route == "local" and "compute bound" in done.reason and "from the last 2 requests" in done.reason
    record = d.decisions.get("r-2")
    assert record is not None and "compute bound" in record.reason
    assert [c async for c in held.reply.chunks]  # type: ignore[union-attr]


def test_the_compute_bound_is_memoised_on_the_rounded_mix(monkeypatch: pytest.MonkeyPatch) -> None:
    import serve_apps.dispatch.admission_plans as module

    calls: list[tuple[float, float]] = []
    real = module.plan_admission

    def counting(perf: Any, memory: int, workload: Any, **kw: Any) -> Any:
        calls.append((workload.prompt_tokens, workload.output_tokens))
        return real(perf, memory, workload, **kw)

    monkeypatch.setattr(module, "plan_admission", counting)
    adm = admission(config(perf=PERF))
    adm.observe("m", 1230, 64)
    first = adm.limit("m", snapshot(), T0)
    adm.observe("m", 1236, 64)  # the mean moves by 3 tokens: same two-digit mix, no new simulation
    assert adm.limit("m", snapshot(), T0) == first
    assert calls == [(1200, 64)]


def _on(cpu_class: str | None, precision: str | None) -> ClusterSnapshot:
    base = snapshot()
    stats = tuple(ReplicaStats(**{**r.__dict__, "cpu_class": cpu_class, "precision": precision}) for r in base.replicas)
    return ClusterSnapshot(taken_at=T0, replicas=stats, max_age_s=1.0)


def test_a_fit_from_another_cpu_or_precision_is_never_applied() -> None:
    """The committed fit was measured on an AMX CPU in bf16; a replica on an AVX2-only CPU runs ~4x slower
    there, so its compute bound would admit 4x too much: it gets the KV-derived limit, and says why."""
    fitted = {**PERF, "cpu": "amx-bf16", "precision": "bfloat16 compiled"}
    adm = admission(config(perf=fitted))
    adm.observe("m", 300, 64)
    assert adm.limit("m", _on("amx-bf16", "bfloat16 compiled"), T0) == 3  # the fit's own machine and precision
    other_cpu = adm.limit_with_reason("m", _on("avx2", "float32 compiled"), T0)
    # as an uncalibrated model: ⌊0.8 × ⌊46,592 / (512 + 256)⌋⌋ = 48 (admission.mean_* tokens)
    assert other_cpu.value == 48
    off = "compute bound off: perf was fitted on an amx-bf16 CPU, the replica runs on avx2"
    assert other_cpu.detail.startswith(off)
    assert other_cpu.detail.endswith("admission.fraction of the KV bound")
    other_precision = adm.limit_with_reason("m", _on("amx-bf16", "float32 compiled"), T0)
    assert "perf was fitted with bfloat16 compiled, the replica runs float32 compiled" in other_precision.detail
    unstated = admission(config(perf=PERF))  # a fit that does not say where it was made is not checked
    unstated.observe("m", 300, 64)
    assert unstated.limit("m", _on("avx2", "float32 compiled"), T0) == 3


def test_each_machine_is_admitted_by_its_own_fit() -> None:
    """One fit per CPU class and precision (the shipped default carries an AVX2 float32 and an AMX bf16 fit): each
    replica's limit comes from the fit for its machine; a machine no fit describes gets the KV-derived limit, and
    the reason names the machines the fits are for."""
    slow = {**PERF, "cpu": "avx2", "precision": "float32 eager", "per_prefill_token_s": 0.0042}
    fast = {**PERF, "cpu": "amx-bf16", "precision": "bfloat16 compiled"}
    adm = admission(config(perf=[slow, fast]))
    adm.observe("m", 300, 64)
    assert adm.limit("m", _on("amx-bf16", "bfloat16 compiled"), T0) == 3  # as with the one fit above
    # ⌊(10 / 1.05 − 5.1) / (64 × 0.0085 + 300 × 0.0042)⌋ = ⌊4.4238 / 1.804⌋ = 2
    assert adm.limit("m", _on("avx2", "float32 eager"), T0) == 2
    neither = adm.limit_with_reason("m", _on("avx512", "float32 eager"), T0)
    assert neither.value == 48 and neither.detail.startswith(
        "compute bound off: no perf fit for replicas on avx512 with float32 eager (fitted: avx2 with float32 eager, "
        "amx-bf16 with bfloat16 compiled)"
    ), neither.detail
    slower = adm.forecast("m", contract(), cpu_snapshot("avx2"), T0, arrived=None)  # the AVX2 fit: slower prefill
    faster = admission(config(perf=fast)).forecast("m", contract(), _on("amx-bf16", "bfloat16 compiled"), T0, None)
    assert slower is not None and faster is not None and slower.e2e_s > faster.e2e_s


def test_a_model_with_two_fits_for_one_machine_is_refused() -> None:
    fit = {**PERF, "cpu": "avx2", "precision": "float32 eager"}
    with pytest.raises(ConfigError, match=r"models\[0\]\.perf.*two perf fits for cpu avx2 with precision float32"):
        config(perf=[fit, {**fit, "step_s": 0.1}])
    with pytest.raises(ConfigError, match=r"models\[0\]\.perf\[1\]\.step_s"):
        config(perf=[fit, {**fit, "cpu": "amx-bf16", "step_s": -1}])
    with pytest.raises(ConfigError, match=r"models\[0\]\.perf\.step_s"):  # one mapping: its fields by name
        config(perf={**fit, "step_s": -1})
    assert config(perf=None).models[0].perf == [] and len(config(perf=[fit]).models[0].perf) == 1


def contract(deadline_ms: int | None = None, prompt: int = 300, output: int = 64) -> RequestContract:
    return RequestContract(
        model="m", scenario="default", level="L2", strategy="quality", est_prompt_tokens=prompt,
        max_output_tokens=output, deadline_ms=deadline_ms,
    )  # fmt: skip


def cpu_snapshot(cpu_class: str | None) -> ClusterSnapshot:
    stats = ReplicaStats("m", "r0", "n1", T0, 0.1, 0, 0, 0, 0, 364, 128, precision="float32 eager", cpu_class=cpu_class)
    return ClusterSnapshot(taken_at=T0, replicas=(stats,), max_age_s=1.0)


def test_the_deadline_forecast_uses_the_fit_only_where_it_describes_the_replicas() -> None:
    fitted = {**PERF, "cpu": "avx2", "precision": "float32 eager"}
    adm = admission(config(perf=fitted))
    adm.observe("m", 300, 64)
    adm.limit("m", cpu_snapshot("avx2"), T0)
    # the model's SLO (10 s) is the deadline; 2 s of it gone (the admission's clock reads T0)
    forecast = adm.forecast("m", contract(), cpu_snapshot("avx2"), T0, arrived=T0 - 2)
    assert forecast is not None and forecast.left_s == pytest.approx(8)
    # nothing in flight: n = 1, TPOT = 0.075 + 0.0085 = 0.0835; e2e = 1.05 × (0.3 + 0.0835 + 0.63 + 63 × 0.0835)
    assert forecast.e2e_s == pytest.approx(1.05 * (0.3 + 0.0835 + 0.63 + 63 * 0.0835))
    header = adm.forecast("m", contract(deadline_ms=1500), cpu_snapshot("avx2"), T0, arrived=None)
    assert header is not None and header.left_s == pytest.approx(1.5) and not header.meets
    assert adm.forecast("m", contract(), cpu_snapshot("amx-bf16"), T0, arrived=None) is None  # another CPU's fit
    no_slo = admission(config(perf={k: v for k, v in fitted.items() if k != "slo_e2e_p95_s"}))
    assert no_slo.forecast("m", contract(), cpu_snapshot("avx2"), T0, arrived=None) is None  # no deadline at all
    assert no_slo.forecast("m", contract(deadline_ms=900), cpu_snapshot("avx2"), T0, arrived=None) is not None
    off = parse_config({"models": [{"alias": "m", "source": "prepared:x", "family": "llama", "perf": fitted}],
                        "admission": {"deadline_spill": False}}, "test")  # fmt: skip
    assert admission(off).forecast("m", contract(), cpu_snapshot("avx2"), T0, arrived=None) is None
    assert admission(config()).forecast("m", contract(deadline_ms=900), cpu_snapshot("avx2"), T0, None) is None


async def test_admitted_requests_are_tracked_until_their_lease_goes() -> None:
    fitted = {**PERF, "cpu": "avx2", "precision": "float32 eager"}
    adm = admission(config(perf=fitted))
    snap = cpu_snapshot("avx2")
    adm.limit("m", snap, T0)
    first = adm.forecast("m", contract(), snap, T0, arrived=None)
    assert first is not None and first.harms == 0
    pipeline = PipelineResult((), (), (), (), {}, ((), ()), {})
    plan = Plan("local", "room", cast(Any, "local:m"), (), frozenset(), pipeline, forecast=first)  # any local target
    await adm.admit("m", plan, lambda: plan, T0 + 60, "r1")
    # r1 runs, due at T0 + 10, predicted at T0 + 6.59 (79 steps left): a 1,500-token prompt would add
    # 1.05 × (1,500 × 0.0021 + 64 × 0.0085) = 3.88 s: late
    big = adm.forecast("m", contract(prompt=1500, output=64), snap, T0, arrived=None)
    assert big is not None and big.harms == 1 and not big.meets
    small = adm.forecast("m", contract(prompt=20, output=8), snap, T0, arrived=None)
    assert small is not None and small.harms == 0
    adm.finish("r1")  # its lease goes: nothing left to harm
    assert adm.forecast("m", contract(prompt=1500, output=64), snap, T0, arrived=None).harms == 0  # type: ignore[union-attr]
