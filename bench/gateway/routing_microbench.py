"""Micro-benchmark of the routing pipeline: filter + score + pick for N candidates.

    python -m bench.gateway.routing_microbench [--iterations 2000] [--candidates 20]

Builds a registry of 1 local and N−1 cloud targets of one alias (mixed capabilities, so some
are filtered out), a tools + JSON-schema request contract, and times `run_pipeline` end to end with
`time.perf_counter_ns` per iteration. Reports p50 / p99 / max in microseconds. The per-plugin
timer inside the pipeline is on (its cost is part of what is measured).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from router import headers as hdr
from router.request.contract import RequestContract, derive_contract
from router.routing.capabilities import ProviderModel, Registry, Target, cloud_target, local_target
from router.routing.pipeline import run_pipeline
from router.routing.plugins import TargetState
from router.routing.policy import Policy

ALIAS = "qwen-7b"


@dataclass(frozen=True)
class MicrobenchResult:
    iterations: int
    candidates: int
    passed: int
    p50_us: float
    p99_us: float
    max_us: float


def _percentile(sorted_values: Sequence[float], p: float) -> float:
    """Linear interpolation between the two nearest ranks (numpy's default)."""
    rank = p / 100 * (len(sorted_values) - 1)
    i = int(rank)
    upper = sorted_values[min(i + 1, len(sorted_values) - 1)]
    return sorted_values[i] + (rank - i) * (upper - sorted_values[i])


def build_targets(candidates: int) -> tuple[Target, ...]:
    engine_args = {"max_model_len": 32768, "enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
    targets = [local_target(ALIAS, engine_args)]
    for i in range(candidates - 1):
        entry = ProviderModel(
            name=f"model-{i}",
            snapshot=f"model-{i}-2025-01-01",
            context_window=8192 * (1 + i % 4),
            tools=i % 3 != 0,
            json_schema=i % 2 == 0,
            region=("eu-west", "us-east")[i % 2],
            data_policy=("retention", "no_retention")[i % 2],
            price_in_per_mtok=0.1 * (i + 1),
            price_out_per_mtok=0.4 * (i + 1),
            quality=0.4 + 0.03 * i,
            expected_latency_ms=300 + 40 * i,
        )
        targets.append(cloud_target(f"provider-{i}", ALIAS, entry))
    return tuple(targets)


def build_contract(policy: Policy) -> RequestContract:
    body = {
        "model": ALIAS,
        "messages": [{"role": "system", "content": "You route tickets."}, {"role": "user", "content": "x" * 4000}],
        "tools": [{"type": "function", "function": {"name": "assign", "parameters": {"type": "object"}}}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "object"}}},
        "max_tokens": 300,
    }
    return derive_contract(body, {hdr.MAX_COST: "0.05"}, policy)


def run_microbench(iterations: int = 2000, candidates: int = 20) -> MicrobenchResult:
    if iterations < 1 or candidates < 1:
        raise ValueError("iterations and candidates must be >= 1")
    policy = Policy()
    registry = Registry(build_targets(candidates))
    contract = build_contract(policy)
    states = {t.id: TargetState(quality=0.5 + (i % 40) / 100) for i, t in enumerate(registry.targets) if i % 2}
    samples: list[float] = []
    result = None
    for _ in range(iterations):
        start = time.perf_counter_ns()
        result = run_pipeline(contract, registry.targets, states, policy)
        samples.append((time.perf_counter_ns() - start) / 1000)
    samples.sort()
    assert result is not None
    return MicrobenchResult(
        iterations=iterations,
        candidates=len(registry.targets),
        passed=len(result.capable),
        p50_us=_percentile(samples, 50),
        p99_us=_percentile(samples, 99),
        max_us=samples[-1],
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gateway.routing_microbench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--candidates", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)
    result = run_microbench(args.iterations, args.candidates)
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        print(
            f"routing pipeline, {result.candidates} candidates ({result.passed} pass the filters), "
            f"{result.iterations} iterations: p50 {result.p50_us:.1f} µs, p99 {result.p99_us:.1f} µs, "
            f"max {result.max_us:.1f} µs"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
