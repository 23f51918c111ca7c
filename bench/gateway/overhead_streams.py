"""`bench overhead --streams`: what users feel along each path — TTFT, TPOT and output tok/s.

Streamed chat completions (a unique prompt of `--prompt-words` random words, so no path is helped
by the prefix cache; `max_tokens` = `--output-tokens` with `ignore_eos`, so every answer has the
same length) go along every path at concurrency 1, 4 and 16, interleaved: each round runs one
batch of `concurrency` simultaneous streams per path, the paths in a shuffled order, so every path
sees the same machine noise. Paths (each an OpenAI base URL):

    vllm          a plain vLLM OpenAI server (`--vllm-url`) of the same model, dtype and engine args
    gateway-http  spillover's gateway to that *same* server through its HTTP-provider path: a
                  provider whose base_url is `--vllm-url`, chosen by `x-spillover-residency:
                  <its region>` (`--http-region`), which keeps the local target out
    gateway       spillover's gateway, local path (Ray Serve → the model's LLMServer replica)
    gateway-direct  (`--gateway-direct-url`) the same through the gateway replica's own listener, no Serve proxy
    ray           Ray's OpenAiIngress over the same replica (`--ray`; `serve_apps.engine.ray_ingress`)
    litellm       a LiteLLM proxy in front of the plain server (`--litellm-url`), when one runs

Same-engine pairs isolate an ingress: gateway-http − vllm is what the gateway adds in front of an
HTTP server; gateway − ray is what it adds over Ray's own ingress on the same replica. gateway vs
vllm compares the whole local stack (Serve proxy, gateway, handle, replica) with the plain server:
two engine processes of the same model and dtype, never busy at the same time.

Per path and level: TTFT p50/p95, TPOT p50 (vLLM's definition, `RequestResult.tpot_s`) and output
tok/s (output tokens of the level's batches / the batches' wall time).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import httpx

from bench.load.loadgen import LoadGenerator, make_client
from bench.load.request_result import RequestResult
from bench.load.stats import percentile
from bench.load.workload import LengthDist, RequestFactory, WorkItem, WorkloadSpec
from router import headers as hdr

DEFAULT_LEVELS = (1, 4, 16)


@dataclass(frozen=True)
class StreamOptions:
    paths: dict[str, str]  # name -> OpenAI base URL (…/v1)
    model: str
    levels: tuple[int, ...] = DEFAULT_LEVELS
    rounds: int = 3
    warmup: int = 1
    prompt_words: int = 220  # ~300 tokens of SmolLM2's tokenizer
    output_tokens: int = 64
    http_region: str | None = None  # the gateway-http path's x-spillover-residency
    seed: int = 0
    request_timeout_s: float = 300.0


@dataclass
class LevelStats:
    path: str
    concurrency: int
    results: list[RequestResult] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    def ttft(self, q: float) -> float | None:
        return percentile([r.ttft_s for r in self.ok if r.ttft_s is not None], q)

    def tpot(self, q: float) -> float | None:
        return percentile([t for r in self.ok if (t := r.tpot_s) is not None], q)

    @property
    def tokens_per_s(self) -> float | None:
        return sum(r.output_tokens for r in self.ok) / self.wall_s if self.wall_s > 0 else None

    @property
    def tokens_per_stream(self) -> float | None:
        return sum(r.output_tokens for r in self.ok) / len(self.ok) if self.ok else None

    @property
    def errors(self) -> int:
        return len(self.results) - len(self.ok)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "concurrency": self.concurrency, "n": len(self.ok), "errors": self.errors,
                "ttft_p50_s": self.ttft(50), "ttft_p95_s": self.ttft(95), "tpot_p50_s": self.tpot(50),
                "tokens_per_s": self.tokens_per_s, "tokens_per_stream": self.tokens_per_stream, "wall_s": self.wall_s,
                "error_codes": sorted({r.error for r in self.results if r.error})}  # fmt: skip


ASK = "\n\nWrite a long story that uses every word above."


def long_answer(item: WorkItem) -> WorkItem:
    """The item's prompt with a request for a long answer: the gateway's HTTP-provider path sends
    only OpenAI's chat fields (no `ignore_eos`), so answers must reach max_tokens by themselves."""
    *rest, last = item.messages
    return replace(item, messages=(*rest, {**last, "content": last["content"] + ASK}))


HTTP_PROVIDER_PATHS = ("gateway-http", "gateway-direct-http")  # sent to the plain server by x-spillover-residency


def extra_headers(name: str, opts: StreamOptions) -> dict[str, str]:
    if name in HTTP_PROVIDER_PATHS and opts.http_region:
        return {hdr.RESIDENCY: opts.http_region}
    return {}


async def measure_streams(opts: StreamOptions, progress: Callable[[str], None]) -> list[LevelStats]:
    """Interleaved batches; returns one LevelStats per (level, path)."""
    rng = random.Random(opts.seed)
    spec = WorkloadSpec(
        prompt=LengthDist.parse(f"fixed:{opts.prompt_words}"), output=LengthDist.parse(f"fixed:{opts.output_tokens}")
    )
    factory = RequestFactory(spec, random.Random(opts.seed + 1))
    clients = {name: make_client(url, read_timeout_s=opts.request_timeout_s) for name, url in opts.paths.items()}
    for name, client in clients.items():
        client.headers.update(extra_headers(name, opts))
    gens = {
        name: LoadGenerator(client, opts.model, extra_body={"ignore_eos": True, "temperature": 0})
        for name, client in clients.items()
    }
    out: list[LevelStats] = []
    try:
        for level in opts.levels:
            stats = {name: LevelStats(name, level) for name in opts.paths}
            order = list(opts.paths)
            for round_no in range(opts.warmup + opts.rounds):
                rng.shuffle(order)
                for name in order:
                    items = [long_answer(item) for item in factory.take(level)]
                    began = time.perf_counter()
                    results = await asyncio.gather(*(gens[name].send(item) for item in items))
                    if round_no >= opts.warmup:
                        stats[name].results += results
                        stats[name].wall_s += time.perf_counter() - began
                if round_no >= opts.warmup:
                    progress(f"  concurrency {level}: round {round_no - opts.warmup + 1}/{opts.rounds}")
            out += [stats[name] for name in opts.paths]
    finally:
        await asyncio.gather(*(c.aclose() for c in clients.values()))
    return out


PAIRS = (
    ("gateway-http", "vllm"),
    ("litellm", "vllm"),
    ("gateway", "ray"),
    ("gateway", "vllm"),
    ("ray", "vllm"),
    ("gateway-direct", "gateway"),
    ("gateway-direct", "vllm"),
    ("gateway-direct-http", "vllm"),
)


def stream_comparisons(stats: Sequence[LevelStats]) -> list[dict[str, Any]]:
    """Per level and pair: added TTFT at p50 (ms), TPOT ratio and tok/s ratio (path over baseline)."""
    by = {(s.path, s.concurrency): s for s in stats}
    rows = []
    for level in sorted({s.concurrency for s in stats}):
        for path, base in PAIRS:
            a, b = by.get((path, level)), by.get((base, level))
            if a is None or b is None:
                continue
            ta, tb, pa, pb, ra, rb = a.ttft(50), b.ttft(50), a.tpot(50), b.tpot(50), a.tokens_per_s, b.tokens_per_s
            rows.append({
                "concurrency": level, "path": path, "baseline": base,
                "ttft_added_ms_p50": None if ta is None or tb is None else (ta - tb) * 1000,
                "tpot_ratio_p50": None if not pa or not pb else pa / pb,
                "tokens_per_s_ratio": None if not ra or not rb else ra / rb,
            })  # fmt: skip
    return rows


@dataclass(frozen=True)
class StreamRun:
    options: StreamOptions
    stats: list[LevelStats]

    def to_dict(self) -> dict[str, Any]:
        return {"options": asdict(self.options), "levels": [s.to_dict() for s in self.stats],
                "comparisons": stream_comparisons(self.stats)}  # fmt: skip


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.0f}"


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def stream_markdown(run: StreamRun) -> list[str]:
    o = run.options
    lines = [
        "## Streams",
        "",
        f"{o.rounds} measured rounds (+{o.warmup} warm-up) per concurrency level; a round sends one batch of "
        f"`concurrency` simultaneous streams along each path, paths shuffled. Prompts: {o.prompt_words} random "
        f"words + a request for a long story, unique per request (no prefix-cache help); answers: max_tokens "
        f"{o.output_tokens} (with `ignore_eos` where the path passes it on).",
        "",
        "| concurrency | path | streams | errors | tokens/stream | TTFT p50 ms | TTFT p95 ms | TPOT p50 ms | "
        "output tok/s |",
        "|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {s.concurrency} | {s.path} | {len(s.ok)} | {s.errors} | {_x(s.tokens_per_stream)} | "
            f"{_ms(s.ttft(50))} | {_ms(s.ttft(95))} | {_ms(s.tpot(50))} | {_x(s.tokens_per_s)} |"
            for s in run.stats
        ),
        "",
        "| concurrency | path vs baseline | TTFT added at p50 (ms) | TPOT ratio | tok/s ratio |",
        "|---|---|---|---|---|",
        *(
            f"| {c['concurrency']} | {c['path']} vs {c['baseline']} | "
            f"{'–' if c['ttft_added_ms_p50'] is None else format(c['ttft_added_ms_p50'], '+.0f')} | "
            f"{_x(c['tpot_ratio_p50'])} | {_x(c['tokens_per_s_ratio'])} |"
            for c in stream_comparisons(run.stats)
        ),
        "",
    ]
    return lines


def run_streams(opts: StreamOptions, progress: Callable[[str], None]) -> StreamRun:
    return StreamRun(opts, asyncio.run(measure_streams(opts, progress)))


def check_paths(paths: dict[str, str]) -> None:
    """Every path answers `GET models` before the run starts (a typo costs seconds, not minutes)."""

    async def probe() -> None:
        for name, url in paths.items():
            async with make_client(url, read_timeout_s=10) as client:
                try:
                    response = await client.get("models")
                except httpx.HTTPError as exc:
                    raise ConnectionError(f"path {name} ({url}) does not answer: {type(exc).__name__}") from None
                if response.status_code != 200:
                    raise ConnectionError(f"path {name} ({url}): GET models answered {response.status_code}")

    asyncio.run(probe())
