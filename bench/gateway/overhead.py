"""`bench overhead`: what each ingress layer costs, measured side by side in one run.

The same tiny request (one user word, `max_tokens` 1, temperature 0) goes, round after round in a
shuffled order, along three paths to the *same* model replica:

    direct    a DeploymentHandle call from this process (`serve_apps.engine.local_backend`, the exact call
              our gateway makes) — the engine plus Serve's handle path, no HTTP
    ray       HTTP through Ray's own OpenAiIngress (`serve_apps.engine.ray_ingress`, deployed for the run
              at /ray and removed after)
    gateway   HTTP through spillover's gateway (contract, routing decision, admission, records)
    gateway-direct  (`--gateway-direct-url`) the same gateway through its replica's own listener
              (`gateway.direct_port`, serve_apps/http/direct.py): no Serve proxy hop

    vllm          (`--vllm-url`) a plain vLLM OpenAI server of the same model, dtype and engine args
    gateway-http  (with `--http-region`) the gateway to that same server through its HTTP-provider path
    gateway-direct-http  (with `--http-region` and `--gateway-direct-url`) the same through the gateway
              replica's own listener
    litellm       (`--litellm-url`) a LiteLLM proxy in front of the plain server, when one runs

Interleaving puts every path under the same machine noise; the report gives p50/p95 per path and
the ratios and differences of the medians (gateway vs ray is spillover's own overhead on the local
path, gateway-http vs vllm on the HTTP-provider path), and the store row: the part of each gateway request
spent on its shared store, from the answer's `Server-Timing: store` entry (serve_apps/state/timing.py).
`--streams` adds what users feel: TTFT, TPOT and output tok/s of streams at concurrency 1, 4, 16 along the
same paths
(`bench/gateway/overhead_streams.py`). The run must happen on a node of the cluster (it joins Ray to get
the handles).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.gateway.overhead_streams import (
    StreamOptions,
    StreamRun,
    check_paths,
    extra_headers,
    run_streams,
    stream_markdown,
)
from bench.gateway.throughput import LevelResult, ThroughputOptions, measure_throughput, throughput_markdown
from bench.load.stats import percentile
from bench.load.target import BenchError
from router import headers as hdr
from serve_apps.state import timing as store_timing

StoreTiming = tuple[float, int]  # (ms, operations) the shared store added to one gateway request

PATHS = ("direct", "ray", "gateway")


@dataclass(frozen=True)
class OverheadOptions:
    base_url: str  # the Serve HTTP proxy, e.g. http://127.0.0.1:8000 (gateway at /v1, Ray's at /ray/v1)
    model: str
    rounds: int = 30
    warmup: int = 3
    seed: int = 0
    request_timeout_s: float = 60.0
    vllm_url: str | None = None  # a plain vLLM OpenAI server of the same model (…/v1): paths vllm, gateway-http
    http_region: str | None = None  # region of the gateway's provider whose base_url is vllm_url
    litellm_url: str | None = None  # a LiteLLM proxy in front of vllm_url (…/v1), optional
    gateway_direct_url: str | None = None  # the gateway replica's own listener's …/v1 (gateway.direct_port)
    streams: StreamOptions | None = None  # also measure streams (bench/gateway/overhead_streams.py)
    ray_paths: bool = True  # direct and ray (joins the Ray cluster); False: the HTTP paths only
    throughput: ThroughputOptions | None = None  # also one gateway replica's req/s (bench/gateway/throughput.py)


@dataclass
class PathStats:
    path: str
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    store_ms: list[float] = field(default_factory=list)  # the gateway's Server-Timing `store` entry, per request
    store_ops: list[int] = field(default_factory=list)

    def p(self, q: float) -> float | None:
        return percentile(self.latencies_s, q)

    def store(self, q: float) -> float | None:
        return percentile(self.store_ms, q)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "n": len(self.latencies_s), "errors": self.errors, "p50_s": self.p(50),
                "p95_s": self.p(95), "latencies_s": self.latencies_s, "store_ms": self.store_ms,
                "store_ops": self.store_ops}  # fmt: skip


Call = Callable[[str], Awaitable[StoreTiming | None]]


def tiny_body(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}


def http_call(client: httpx.AsyncClient, url: str, model: str, headers: dict[str, str] | None = None) -> Call:
    async def call(request_id: str) -> StoreTiming | None:
        sent = {hdr.REQUEST_ID: request_id, **(headers or {})}
        response = await client.post(url, json=tiny_body(model), headers=sent)
        if response.status_code != 200 or not response.json().get("choices"):
            raise BenchError(f"{url}: HTTP {response.status_code}: {response.text[:200]}")
        return store_timing.parse(response.headers.get(store_timing.HEADER))

    return call


async def measure(calls: dict[str, Call], opts: OverheadOptions, progress: Callable[[str], None]) -> list[PathStats]:
    """Interleaved rounds: each round calls every path once, in a shuffled order."""
    rng = random.Random(opts.seed)
    stats = {name: PathStats(name) for name in calls}
    order = list(calls)
    for round_no in range(opts.warmup + opts.rounds):
        rng.shuffle(order)
        for name in order:
            began = time.perf_counter()
            try:
                spent = await calls[name](f"overhead-{name}-{round_no}-{rng.getrandbits(32):08x}")
            except Exception:  # noqa: BLE001 -- counted, the run goes on
                stats[name].errors += round_no >= opts.warmup
                continue
            if round_no >= opts.warmup:
                stats[name].latencies_s.append(time.perf_counter() - began)
                if spent is not None:
                    stats[name].store_ms.append(spent[0])
                    stats[name].store_ops.append(spent[1])
        if round_no >= opts.warmup and (round_no - opts.warmup + 1) % 10 == 0:
            progress(f"  round {round_no - opts.warmup + 1}/{opts.rounds}")
    return [stats[name] for name in calls]


def comparisons(stats: list[PathStats]) -> list[dict[str, Any]]:
    """Ratio and difference of the medians for every pair (later path over earlier)."""
    by = {s.path: s for s in stats}
    out = []
    pairs = (
        ("ray", "direct"),
        ("gateway", "direct"),
        ("gateway", "ray"),
        ("gateway-direct", "gateway"),
        ("gateway-direct", "ray"),
        ("gateway-direct", "direct"),
        ("gateway-http", "vllm"),
        ("gateway-direct-http", "vllm"),
        ("litellm", "vllm"),
    )
    for a, b in pairs:
        if a in by and b in by and by[a].p(50) and by[b].p(50):
            pa, pb = by[a].p(50) or 0.0, by[b].p(50) or 0.0
            out.append({"path": a, "baseline": b, "ratio_p50": pa / pb, "extra_ms_p50": (pa - pb) * 1000})
    return out


@dataclass(frozen=True)
class OverheadRun:
    options: OverheadOptions
    stats: list[PathStats]
    started_at: str
    environment: dict[str, Any]
    exit_code: int = 0
    streams: StreamRun | None = None
    throughput: list[LevelResult] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "options": asdict(self.options),
                "paths": [s.to_dict() for s in self.stats], "comparisons": comparisons(self.stats),
                "streams": self.streams.to_dict() if self.streams else None,
                "throughput": [r.to_dict() for r in self.throughput] if self.throughput is not None else None,
                "environment": self.environment}  # fmt: skip


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.1f}"


def render_markdown(run: OverheadRun) -> str:
    from bench.calibrate.report import environment_and_plots

    o = run.options
    lines = [
        f"# Ingress overhead — `{o.model}`",
        "",
        f"Started {run.started_at}. {o.rounds} measured rounds (+{o.warmup} warm-up), each sending one tiny request "
        "(`Hi`, max_tokens 1) along every path in a shuffled order, one at a time, to the same model replica.",
        "",
        "| path | requests | errors | p50 ms | p95 ms |",
        "|---|---|---|---|---|",
        *(f"| {s.path} | {len(s.latencies_s)} | {s.errors} | {_ms(s.p(50))} | {_ms(s.p(95))} |" for s in run.stats),
        "",
        "| path vs baseline | p50 ratio | extra ms at p50 |",
        "|---|---|---|",
        *(
            f"| {c['path']} vs {c['baseline']} | {c['ratio_p50']:.2f} | {c['extra_ms_p50']:+.1f} |"
            for c in comparisons(run.stats)
        ),
        "",
        "direct = a DeploymentHandle call from the bench process (engine + Serve handle, no HTTP); ray = Ray's "
        "OpenAiIngress over the same replica; gateway = spillover. *gateway vs ray* is what spillover adds. "
        "vllm = a plain vLLM OpenAI server of the same model and dtype; gateway-http = spillover's gateway to "
        "that same server through its HTTP-provider path; litellm = a LiteLLM proxy in front of it; "
        "gateway-direct = spillover's gateway through its replica's own listener (`gateway.direct_port`), without "
        "Serve's proxy: *gateway-direct vs gateway* is the proxy hop; gateway-direct-http = the HTTP-provider path "
        "through that listener.",
        "",
        *store_markdown(run.stats),
        *(stream_markdown(run.streams) if run.streams else []),
        *(throughput_markdown(run.throughput, o.throughput) if run.throughput is not None and o.throughput else []),
        *environment_and_plots(run.environment, []),
    ]
    return "\n".join(lines) + "\n"


def write_overhead_report(run: OverheadRun, out_dir: Path) -> None:
    from bench.calibrate.report import write_results

    write_results(out_dir, run.to_dict(), render_markdown(run))


def run_overhead(
    opts: OverheadOptions, config_path: str, out_dir: Path | None, *, progress: bool = True
) -> OverheadRun:
    """Join the Ray cluster, deploy Ray's ingress over the running replicas, measure, clean up."""
    import ray

    from bench.calibrate.report import environment, progress_printer
    from cluster.config.deployment import load_config
    from router.errors import SpilloverError
    from serve_apps.engine.local_backend import ServeHandleBackend
    from serve_apps.engine.ray_ingress import deploy_ray_ingress, model_handles, remove_ray_ingress

    say = progress_printer(progress)
    for noisy in ("httpx", "httpcore"):  # Ray's logging setup would print a line per request of the run
        logging.getLogger(noisy).setLevel(logging.WARNING)
    config = load_config(config_path)
    if config.model(opts.model) is None:
        raise BenchError(f"model {opts.model!r} is not in {config_path}", exit_code=2)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    if opts.ray_paths:
        try:
            ray.init(address=config.cluster.address or "auto", namespace="serve", log_to_driver=False)
        except ConnectionError as exc:
            raise BenchError(f"no Ray cluster to join ({exc}); run this on a node of the running cluster") from None
    try:
        prefix = None
        if opts.ray_paths:
            say("deploying Ray's OpenAiIngress at /ray over the running replicas ...")
            prefix = deploy_ray_ingress(config, config_path=config_path)
            backend = ServeHandleBackend(model_handles(config))

        async def direct(request_id: str) -> StoreTiming | None:
            reply = await backend.call(opts.model, "chat", tiny_body(opts.model), request_id)
            if reply.body is None:
                raise BenchError("the handle streamed an answer to a non-streamed request")
            return None

        async def main() -> list[PathStats]:
            base = opts.base_url.rstrip("/")
            async with httpx.AsyncClient(timeout=opts.request_timeout_s) as client:
                calls: dict[str, Call] = {}
                if prefix is not None:
                    calls["direct"] = direct
                    calls["ray"] = http_call(client, f"{base}{prefix}/v1/chat/completions", opts.model)
                calls["gateway"] = http_call(client, f"{base}/v1/chat/completions", opts.model)
                for name, url in http_paths(opts).items():
                    headers = extra_headers(
                        name, opts.streams or StreamOptions({}, opts.model, http_region=opts.http_region)
                    )
                    calls[name] = http_call(client, f"{url}/chat/completions", opts.model, headers)
                return await measure(calls, opts, say)

        stats = asyncio.run(main())
        streams = None
        if opts.streams is not None:
            paths = {"gateway": f"{opts.base_url.rstrip('/')}/v1"}
            if prefix is not None:
                paths["ray"] = f"{opts.base_url.rstrip('/')}{prefix}/v1"
            paths |= http_paths(opts)
            check_paths(paths)
            say(f"streams along {', '.join(paths)} at concurrency {', '.join(map(str, opts.streams.levels))} ...")
            streams = run_streams(replace(opts.streams, paths=paths, http_region=opts.http_region), say)
        throughput = None
        if opts.throughput is not None:
            levels = ", ".join(map(str, opts.throughput.levels))
            say(f"gateway throughput against the zero-latency simulator at concurrency {levels} ...")
            throughput = asyncio.run(measure_throughput(opts.throughput, say))
    except SpilloverError as exc:
        raise BenchError(exc.message) from None
    finally:
        if opts.ray_paths:
            try:
                remove_ray_ingress()
            finally:
                ray.shutdown()
    failed = any(not s.latencies_s for s in stats)
    failed = failed or (streams is not None and any(not s.ok for s in streams.stats))
    failed = failed or (throughput is not None and any(not r.latencies_s for r in throughput))
    run = OverheadRun(
        opts, stats, started, environment(), exit_code=1 if failed else 0, streams=streams, throughput=throughput
    )
    if out_dir is not None:
        write_overhead_report(run, out_dir)
    return run


def http_paths(opts: OverheadOptions) -> dict[str, str]:
    """The HTTP paths around a plain vLLM server, by name (base URLs ending in /v1)."""
    paths: dict[str, str] = {}
    if opts.vllm_url:
        paths["vllm"] = opts.vllm_url.rstrip("/")
        if opts.http_region:
            paths["gateway-http"] = f"{opts.base_url.rstrip('/')}/v1"
    if opts.litellm_url:
        paths["litellm"] = opts.litellm_url.rstrip("/")
    if opts.gateway_direct_url:
        paths["gateway-direct"] = opts.gateway_direct_url.rstrip("/")
        if opts.vllm_url and opts.http_region:
            paths["gateway-direct-http"] = opts.gateway_direct_url.rstrip("/")
    return paths


def store_markdown(stats: list[PathStats]) -> list[str]:
    """The `store` row: what the shared store added to each gateway request (its Server-Timing entry)."""
    rows = [s for s in stats if s.store_ms]
    if not rows:
        return []
    lines = [
        "| store in | requests | ops per request (p50) | store ms p50 | store ms p99 | share of the path's p50 |",
        "|---|---|---|---|---|---|",
    ]
    for s in rows:
        ops = sorted(s.store_ops)[len(s.store_ops) // 2]
        p50, p99, path = s.store(50) or 0.0, s.store(99) or 0.0, (s.p(50) or 0.0) * 1000
        share = f"{p50 / path:.1%}" if path else "–"
        lines.append(f"| {s.path} | {len(s.store_ms)} | {ops} | {p50:.2f} | {p99:.2f} | {share} |")
    return [
        *lines,
        "",
        "store = the time the gateway spent waiting on its shared store (`state.url`: Redis; the in-process store "
        "without it) on each request's path, from the answer's `Server-Timing: store` entry "
        "(serve_apps/state/timing.py): admission's lease, the tenant's window and lease, an Idempotency-Key's "
        "marker. Writes off the path (records, lease drops, spend sums) are not in it.",
        "",
    ]


def summary_lines(run: OverheadRun) -> list[str]:
    lines = [f"{s.path:8s} p50 {_ms(s.p(50))} ms  p95 {_ms(s.p(95))} ms  errors {s.errors}" for s in run.stats]
    lines += [
        f"store in {s.path}: p50 {s.store(50) or 0:.2f} ms  p99 {s.store(99) or 0:.2f} ms per request"
        for s in run.stats
        if s.store_ms
    ]
    lines += [
        f"{c['path']} vs {c['baseline']}: x{c['ratio_p50']:.2f} ({c['extra_ms_p50']:+.1f} ms at p50)"
        for c in comparisons(run.stats)
    ]
    for level in run.streams.stats if run.streams else []:
        lines.append(
            f"streams c={level.concurrency:<3} {level.path:13s} TTFT p50 {_ms(level.ttft(50))} ms  "
            f"TPOT p50 {_ms(level.tpot(50))} ms  {level.tokens_per_s or 0:.1f} tok/s  errors {level.errors}"
        )
    for r in run.throughput or []:
        lines.append(
            f"throughput c={r.concurrency:<3} {r.path:11s} {r.requests_per_s:.1f} req/s  p50 {_ms(r.p(50))} ms  "
            f"p99 {_ms(r.p(99))} ms  errors {r.errors}"
        )
    return lines
