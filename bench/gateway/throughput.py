"""`bench overhead --throughput`: how many requests/s one gateway replica sustains, and what it adds.

A cloud simulator answering at once (`--ttft-s 0 --tokens-per-s 0`) stands in for a provider that costs
nothing, so whatever limits the gateway path is the gateway itself (its HTTP layer, contract, routing
decision, records, the provider adapter) and Serve's proxy in front of it. Two paths, each a closed loop of
`concurrency` workers sending the same tiny chat (`max_tokens` 1) for `duration_s` seconds:

    sim                 straight to the simulator (…/v1) — what the machine does without the gateway
    gateway-sim         through the gateway, sent to the simulator by `x-spillover-residency: <its region>`
    gateway-direct-sim  (with `direct_url`) the same through the gateway replica's own listener
                        (`gateway.direct_port`), without Serve's proxy

Levels run one after the other, the two paths in a shuffled order inside each level, after a warm-up;
both share the machine with the simulator, so read the ratio of the two paths at each level (req/s, and
latency added at p50 / p99), not the absolute figures. A gateway path's sustained rate is its best req/s
over the levels, with its p99 added latency at that level.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.load.stats import percentile
from router import headers as hdr

DEFAULT_LEVELS = (1, 8, 32)
PATHS = ("sim", "gateway-sim")


@dataclass(frozen=True)
class ThroughputOptions:
    gateway_url: str  # the gateway's …/v1
    sim_url: str  # the zero-latency simulator's …/v1
    sim_region: str  # region of the gateway's provider whose base_url is sim_url
    model: str
    direct_url: str | None = None  # the gateway replica's own listener's …/v1 (gateway.direct_port)
    levels: tuple[int, ...] = DEFAULT_LEVELS
    duration_s: float = 10.0
    warmup_s: float = 2.0
    request_timeout_s: float = 30.0
    seed: int = 0


@dataclass
class LevelResult:
    path: str
    concurrency: int
    duration_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def requests_per_s(self) -> float:
        return len(self.latencies_s) / self.duration_s if self.duration_s > 0 else 0.0

    def p(self, q: float) -> float | None:
        return percentile(self.latencies_s, q)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "concurrency": self.concurrency, "duration_s": self.duration_s,
                "requests": len(self.latencies_s), "errors": self.errors, "requests_per_s": self.requests_per_s,
                "p50_s": self.p(50), "p99_s": self.p(99)}  # fmt: skip


def _body(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}


async def _closed_loop(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any],
    concurrency: int,
    seconds: float,
    result: LevelResult | None,
) -> None:
    """`concurrency` workers, each sending its next request when the last one answered, until `seconds`
    have passed; with a `result`, every answer's latency (or error) lands there."""
    ends = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < ends:
            began = time.perf_counter()
            try:
                response = await client.post(url, json=body, headers=headers)
                ok = response.status_code == 200 and bool(response.json().get("choices"))
            except (httpx.HTTPError, ValueError):
                ok = False
            if result is None:
                continue
            if ok:
                result.latencies_s.append(time.perf_counter() - began)
            else:
                result.errors += 1

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    if result is not None:
        result.duration_s = time.perf_counter() - began


def path_targets(opts: ThroughputOptions) -> dict[str, tuple[str, dict[str, str]]]:
    """Each path's chat URL and extra headers."""
    targets = {
        "sim": (f"{opts.sim_url.rstrip('/')}/chat/completions", {}),
        "gateway-sim": (f"{opts.gateway_url.rstrip('/')}/chat/completions", {hdr.RESIDENCY: opts.sim_region}),
    }
    if opts.direct_url:
        targets["gateway-direct-sim"] = (
            f"{opts.direct_url.rstrip('/')}/chat/completions",
            {hdr.RESIDENCY: opts.sim_region},
        )
    return targets


async def measure_throughput(
    opts: ThroughputOptions,
    progress: Callable[[str], None],
    *,
    client: httpx.AsyncClient | None = None,
) -> list[LevelResult]:
    """One LevelResult per (level, path), levels in order, paths shuffled inside each level."""
    rng = random.Random(opts.seed)
    targets = path_targets(opts)
    body = _body(opts.model)
    limits = httpx.Limits(max_connections=max(opts.levels) * 2, max_keepalive_connections=max(opts.levels) * 2)
    own = client is None
    http = client or httpx.AsyncClient(timeout=opts.request_timeout_s, limits=limits)
    results: list[LevelResult] = []
    try:
        for url, headers in targets.values():  # warm-up: connections, the gateway's first decisions
            await _closed_loop(http, url, headers, body, min(opts.levels), opts.warmup_s, None)
        for level in opts.levels:
            order = list(targets)
            rng.shuffle(order)
            by_path = {}
            for name in order:
                url, headers = targets[name]
                result = LevelResult(name, level)
                await _closed_loop(http, url, headers, body, level, opts.duration_s, result)
                by_path[name] = result
                progress(f"  throughput c={level} {name}: {result.requests_per_s:.0f} req/s, {result.errors} errors")
            results += [by_path[name] for name in targets]
    finally:
        if own:
            await http.aclose()
    return results


GATEWAY_PATHS = ("gateway-sim", "gateway-direct-sim")


def throughput_comparisons(results: list[LevelResult]) -> list[dict[str, Any]]:
    """Per level and gateway path: its req/s over sim's, and the latency it adds at p50 and p99."""
    out = []
    for level in sorted({r.concurrency for r in results}):
        by = {r.path: r for r in results if r.concurrency == level}
        sim = by.get("sim")
        for path in GATEWAY_PATHS:
            gw = by.get(path)
            if sim is None or gw is None or not sim.requests_per_s or sim.p(50) is None or gw.p(50) is None:
                continue
            out.append({
                "concurrency": level,
                "path": path,
                "rps_ratio": gw.requests_per_s / sim.requests_per_s,
                "added_ms_p50": ((gw.p(50) or 0.0) - (sim.p(50) or 0.0)) * 1000,
                "added_ms_p99": ((gw.p(99) or 0.0) - (sim.p(99) or 0.0)) * 1000,
            })  # fmt: skip
    return out


def sustained(results: list[LevelResult], path: str = "gateway-sim") -> LevelResult | None:
    """A gateway path's best level by requests/s (errors excluded from the rate)."""
    gateway = [r for r in results if r.path == path and r.latencies_s]
    return max(gateway, key=lambda r: r.requests_per_s, default=None)


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.1f}"


def _headline(results: list[LevelResult], comparisons: list[dict[str, Any]], path: str) -> str:
    best = sustained(results, path)
    if best is None:
        return f"no {path} level completed a request"
    added = {(c["concurrency"], c["path"]): c for c in comparisons}
    extra = added.get((best.concurrency, path), {}).get("added_ms_p99")
    p99 = "–" if extra is None else f"{extra:+.1f} ms"
    return (
        f"`{path}`: one gateway replica sustained **{best.requests_per_s:.0f} req/s** (at concurrency "
        f"{best.concurrency}; p99 added over the simulator alone: {p99})"
    )


def throughput_markdown(results: list[LevelResult], opts: ThroughputOptions) -> list[str]:
    comparisons = throughput_comparisons(results)
    paths = [p for p in GATEWAY_PATHS if any(r.path == p for r in results)] or ["gateway-sim"]
    headline = "; ".join(_headline(results, comparisons, p) for p in paths)
    direct = (
        ", `gateway-direct-sim` the same through the gateway replica's own listener (`gateway.direct_port`, "
        "no Serve proxy)"
        if "gateway-direct-sim" in paths
        else ""
    )
    return [
        "## Gateway throughput",
        "",
        f"Closed loops of tiny chats (max_tokens 1) for {opts.duration_s:g} s per path and level against a cloud "
        "simulator that answers at once (`--ttft-s 0 --tokens-per-s 0`): `sim` straight to it, `gateway-sim` "
        f"through one gateway replica to it (`x-spillover-residency: {opts.sim_region}`){direct}. All share the "
        f"machine with the simulator: read the ratios. Result: {headline}.",
        "",
        "| concurrency | path | requests | errors | req/s | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r.concurrency} | {r.path} | {len(r.latencies_s)} | {r.errors} | {r.requests_per_s:.1f} | "
            f"{_ms(r.p(50))} | {_ms(r.p(99))} |"
            for r in results
        ),
        "",
        "| concurrency | path | req/s ÷ sim | added ms at p50 | added ms at p99 |",
        "|---|---|---|---|---|",
        *(
            f"| {c['concurrency']} | {c['path']} | {c['rps_ratio']:.2f} | {c['added_ms_p50']:+.1f} | "
            f"{c['added_ms_p99']:+.1f} |"
            for c in comparisons
        ),
        "",
    ]
