"""`bench affinity`: prefix-affinity replica choice vs Ray's default power-of-two, in one run.

Two aliases of the same model, each with 2 replicas, differ only in `replica_router`
(`configs/bench-affinity.yaml`: `qwen-affinity` uses spillover's `SaturationAwarePrefixRouter`,
`qwen-pow2` Ray's default). The same shared-prefix workload — `prefixes` long system prompts, each
request one of them plus a unique question — goes to both, request by request in a shuffled order,
`concurrency` at a time. Per alias it reports the prefix-cache hit rate (Σ cached prompt tokens ÷ Σ
prompt tokens, from `usage.prompt_tokens_details`), the time to the one output token (max_tokens 1:
≈ TTFT) p50/p95, and how each replica's own prefix counters moved (`/v1/spillover/cluster`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.load.stats import percentile
from bench.load.target import BenchError
from bench.load.workload import WORDS


@dataclass(frozen=True)
class AffinityOptions:
    url: str  # the gateway's OpenAI base, .../v1
    models: tuple[str, ...] = ("qwen-affinity", "qwen-pow2")
    prefixes: int = 8
    prefix_words: int = 600
    requests: int = 96  # per model
    concurrency: int = 2
    seed: int = 0
    request_timeout_s: float = 120.0


@dataclass
class ModelResult:
    model: str
    latencies_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    errors: int = 0
    replicas: dict[str, dict[str, int]] = field(default_factory=dict)  # replica -> query/hit deltas

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hit_rate": self.hit_rate, "p50_s": percentile(self.latencies_s, 50),
                "p95_s": percentile(self.latencies_s, 95)}  # fmt: skip


def prompts(opts: AffinityOptions, rng: random.Random) -> list[tuple[int, str]]:
    """(prefix index, full prompt) per request: the same list for every model."""
    systems = [" ".join(rng.choice(WORDS) for _ in range(opts.prefix_words)) for _ in range(opts.prefixes)]
    out = []
    for i in range(opts.requests):
        k = rng.randrange(opts.prefixes)
        question = " ".join(rng.choice(WORDS) for _ in range(12))
        out.append((k, f"{systems[k]}\n\nQuestion {i}: {question}"))
    return out


async def _counters(client: httpx.AsyncClient, base: str) -> dict[tuple[str, str], tuple[int, int]]:
    data = (await client.get(f"{base}/v1/spillover/cluster")).json()
    return {
        (r["model"], r["replica_id"]): (r["prefix_cache_queries"], r["prefix_cache_hits"]) for r in data["replicas"]
    }


async def run_affinity(opts: AffinityOptions, progress: Callable[[str], None]) -> list[ModelResult]:
    rng = random.Random(opts.seed)
    work = prompts(opts, rng)
    jobs = [(model, i) for i in range(len(work)) for model in opts.models]
    # interleaved: request i of every model close together, the models' order shuffled per i
    for start in range(0, len(jobs), len(opts.models)):
        chunk = jobs[start : start + len(opts.models)]
        rng.shuffle(chunk)
        jobs[start : start + len(opts.models)] = chunk
    results = {m: ModelResult(m) for m in opts.models}
    base = opts.url.rstrip("/").removesuffix("/v1")
    async with httpx.AsyncClient(timeout=opts.request_timeout_s) as client:
        before = await _counters(client, base)
        missing = [m for m in opts.models if not any(model == m for model, _ in before)]
        if missing:
            raise BenchError(f"the gateway reports no replica stats for {missing}; deploy configs/bench-affinity.yaml")
        gate = asyncio.Semaphore(opts.concurrency)
        done = 0

        async def one(model: str, index: int) -> None:
            nonlocal done
            body = {"model": model, "messages": [{"role": "user", "content": work[index][1]}], "max_tokens": 1}
            async with gate:
                began = time.perf_counter()
                try:
                    response = await client.post(f"{opts.url}/chat/completions", json=body)
                except httpx.HTTPError:
                    results[model].errors += 1
                    return
                elapsed = time.perf_counter() - began
            if response.status_code != 200:
                results[model].errors += 1
                return
            usage = response.json().get("usage") or {}
            results[model].latencies_s.append(elapsed)
            results[model].prompt_tokens += int(usage.get("prompt_tokens") or 0)
            results[model].cached_tokens += int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            done += 1
            if done % 20 == 0:
                progress(f"  {done}/{len(jobs)} requests")

        await asyncio.gather(*(one(model, index) for model, index in jobs))
        after = await _counters(client, base)
    for (model, replica), (queries, hits) in after.items():
        if model in results:
            q0, h0 = before.get((model, replica), (0, 0))
            results[model].replicas[replica[:12]] = {"queries": queries - q0, "hits": hits - h0}
    return [results[m] for m in opts.models]


def markdown_table(results: list[ModelResult]) -> str:
    lines = [
        "| model (router) | requests | errors | prefix-cache hit rate | TTFT p50 ms | TTFT p95 ms "
        "| per replica: queried / hit tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        p50, p95 = percentile(r.latencies_s, 50), percentile(r.latencies_s, 95)
        per = "; ".join(f"{k}: {v['queries']} / {v['hits']}" for k, v in sorted(r.replicas.items()))
        lines.append(
            f"| {r.model} | {len(r.latencies_s)} | {r.errors} | {r.hit_rate:.1%} | "
            f"{(p50 or 0) * 1000:.1f} | {(p95 or 0) * 1000:.1f} | {per} |"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class AffinityRun:
    options: AffinityOptions
    results: list[ModelResult]
    started_at: str
    environment: dict[str, Any]

    @property
    def exit_code(self) -> int:
        return 0 if all(r.latencies_s for r in self.results) else 1

    def to_dict(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "options": asdict(self.options),
                "results": [r.to_dict() for r in self.results], "environment": self.environment}  # fmt: skip


def render_markdown(run: AffinityRun) -> str:
    from bench.calibrate.report import environment_and_plots

    o = run.options
    lines = [
        "# Replica choice: prefix affinity vs power of two",
        "",
        f"Started {run.started_at}. {o.requests} requests per model, {o.concurrency} in flight, interleaved between "
        f"{', '.join(f'`{m}`' for m in o.models)} (the same model, 2 replicas each, differing only in "
        f"`replica_router`); each prompt is one of {o.prefixes} system prompts of {o.prefix_words} words plus a "
        "unique question; `max_tokens` 1, so the latency is the time to the first token.",
        "",
        markdown_table(run.results),
        *environment_and_plots(run.environment, []),
    ]
    return "\n".join(lines) + "\n"


def run_affinity_command(opts: AffinityOptions, out_dir: Path | None, *, progress: bool = True) -> AffinityRun:
    from bench.calibrate.report import environment, progress_printer, write_results

    started = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        results = asyncio.run(run_affinity(opts, progress_printer(progress)))
    except httpx.HTTPError as exc:
        raise BenchError(f"{opts.url}: {exc}") from None
    run = AffinityRun(opts, results, started, environment())
    if out_dir is not None:
        write_results(out_dir, run.to_dict(), render_markdown(run))
    return run


def summary_lines(run: AffinityRun) -> list[str]:
    return [markdown_table(run.results)]
