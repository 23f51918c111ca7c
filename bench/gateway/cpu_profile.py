"""Where the gateway's own time goes per request: its real HTTP layer in one process, zero-latency ends.

    python -m bench.gateway.cpu_profile [--requests 2000] [--top 30] [--out DIR]

The gateway is built as `serve_apps/gateway_build.py` builds it — `GatewayHTTP`, the `Dispatcher` with
the contract pipeline, admission, `Resilience`, decision store, metrics — from `configs/local.yaml`
with its cloud provider enabled. Both ends answer at once: the local engine is an in-process
`ModelBackend` that returns a fixed chat completion (or a 3-chunk stream), the provider's server an
`httpx.MockTransport` with the same answer. Requests come through `httpx.ASGITransport`, one at a
time, so what is measured is the gateway's own CPU per request (no Serve proxy, no Ray handle, no
network) along three paths: local JSON, local stream, and the HTTP-provider path
(`x-spillover-residency` set to the provider's region). Prints requests/s per path and the
cProfile functions with the most cumulative time on each; `--out` writes them to files.
Run it on an idle machine; it measures this process only.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from cluster.config.deployment import default_config_path, dump_config, load_config, parse_config
from router import headers as hdr
from router.request.openai_request import Kind
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.backend import BackendReply
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.gateway_parts import EdgeSettings, GatewayParts, OperatorParts
from serve_apps.http.surface import GatewayHTTP, ServedModel
from serve_apps.providers import OpenAICompatProvider
from serve_apps.resilience.state import Resilience

MESSAGE = {"role": "assistant", "content": "The capital of France is Paris."}
USAGE = {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}


class InstantEngine:
    """A `ModelBackend` that answers at once, like vLLM's chat endpoint."""

    async def call(self, alias: str, kind: Kind, body: dict[str, Any], request_id: str) -> BackendReply:
        if body.get("stream"):
            return BackendReply(chunks=self._chunks())
        return BackendReply(body={"object": "chat.completion", "model": alias, "usage": USAGE,
                                  "choices": [{"index": 0, "message": MESSAGE, "finish_reason": "stop"}]})  # fmt: skip

    async def _chunks(self) -> AsyncIterator[str]:
        for word in ("The capital", " of France", " is Paris."):
            yield f'data: {{"choices": [{{"index": 0, "delta": {{"content": "{word}"}}}}]}}\n\n'
        yield "data: [DONE]\n\n"

    async def check_health(self, alias: str, timeout_s: float) -> str | None:
        return None


def provider_answer(request: httpx.Request) -> httpx.Response:
    body = {"object": "chat.completion", "usage": USAGE, "choices": [{"index": 0, "message": MESSAGE}]}
    return httpx.Response(200, json=body)


def build(config_path: str) -> tuple[Any, str, str]:
    """(ASGI app, model alias, the provider's region)."""
    raw = dump_config(load_config(config_path))
    provider = raw["cloud"]["providers"][0]
    provider.update(enabled=True, api_key_env=None)
    raw["resilience"] = {**raw.get("resilience", {}), "probes": False}
    config = parse_config(raw, config_path)
    spec = config.models[0]
    region = str(next(iter(config.cloud.providers[0].models.values())).region)  # type: ignore[union-attr]
    adapter = OpenAICompatProvider(config.cloud.providers[0], transport=httpx.MockTransport(provider_answer))
    replica = ReplicaStats(spec.alias, "r1", "n1", time.time(), 0.1, 0, 0, 0, 0, 728, 128)
    snapshot = ClusterSnapshot(taken_at=time.time(), replicas=(replica,), max_age_s=1e12)
    engine = InstantEngine()
    resilience = Resilience(config)
    dispatcher = Dispatcher(
        config, engine, {adapter.name: adapter}, lambda: snapshot, parts=DispatchParts(resilience=resilience)
    )
    http = GatewayHTTP(
        engine,
        [ServedModel(spec.alias, spec.family, spec.accelerator, spec.engine_args.get("max_model_len"))],
        dispatcher,
        created=0,
        edge=EdgeSettings(max_body_bytes=config.gateway.max_body_bytes),
        parts=GatewayParts(policy=config.policy, decisions=dispatcher.decisions),
        operator=OperatorParts(snapshot=lambda: snapshot),
    )
    return http.app, spec.alias, region


PATHS = ("local-json", "local-stream", "provider-json")


async def drive(app: Any, model: str, region: str, path: str, requests: int) -> float:
    """Send `requests` one at a time along `path`; returns the seconds they took."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    headers = {hdr.RESIDENCY: region} if path == "provider-json" else {}
    if path == "local-stream":
        body["stream"] = True
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=30) as client:
        began = time.perf_counter()
        for _ in range(requests):
            response = await client.post("/v1/chat/completions", json=body, headers=headers)
            if response.status_code != 200:
                raise RuntimeError(f"{path}: HTTP {response.status_code}: {response.text[:200]}")
            expected = "local" if path.startswith("local") else "cloud"
            if response.headers.get(hdr.ROUTE) != expected:
                raise RuntimeError(f"{path}: routed {response.headers.get(hdr.ROUTE)}, expected {expected}")
        return time.perf_counter() - began


def profile(config_path: str, requests: int, top: int) -> dict[str, tuple[float, str]]:
    """Per path: (requests per second without the profiler, the cProfile top list)."""
    app, model, region = build(config_path)
    out: dict[str, tuple[float, str]] = {}
    for path in PATHS:
        asyncio.run(drive(app, model, region, path, 50))  # warm-up: imports, caches, first records
        seconds = asyncio.run(drive(app, model, region, path, requests))
        profiler = cProfile.Profile()
        profiler.enable()
        asyncio.run(drive(app, model, region, path, requests))
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(top)
        out[path] = (requests / seconds, text.getvalue())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway.cpu_profile", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(default_config_path()))
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", default=None, help="directory for <path>.txt profiles")
    args = parser.parse_args(argv)
    results = profile(args.config, args.requests, args.top)
    for path, (rate, text) in results.items():
        print(f"{path:14s} {rate:8.0f} requests/s  ({1e6 / rate:.0f} µs per request, this process only)")
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / f"{path}.txt").write_text(text)
    if not args.out:
        for path, (_, text) in results.items():
            print(f"\n== {path} ==\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
