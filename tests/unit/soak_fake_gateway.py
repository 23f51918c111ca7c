"""A fake gateway for the soak's short runs (tests/unit/test_bench_soak_runs.py), served in process or on
a loopback port by uvicorn in a thread.

It reproduces what the real gateway shows the soak: the OpenAI chat surface (JSON and SSE),
`x-spillover-route` / `-target` on every answer, `x-spillover-residency: <region>` sending a request to
the cloud provider of that region (here a cloud-sim) and anything else to the local model (here an
in-process cloud-sim app: deterministic answers, as a greedy engine gives), upstream errors passed on
as OpenAI error bodies with their status, and `GET /v1/spillover/cluster` listing the model's replica
with precision and numerics (router/routing/snapshot.py `ReplicaStats.to_dict`).
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench.cloud_sim import SimSettings, build_app
from router import headers as hdr

MODEL = "smollm2-135m-instruct"
SIM_MODEL = "sim-smollm2"


class FakeGateway:
    """See the module docstring."""

    def __init__(self, cloud_url: str | None = None) -> None:
        self._cloud_url = cloud_url
        self._local_app = build_app(
            SimSettings(models=(MODEL,), ttft_s=0.005, tokens_per_s=2000, max_concurrency=0), rng=random.Random(0)
        )
        self._clients: dict[str, httpx.AsyncClient] = {}
        self.residencies: list[str | None] = []
        self.app = Starlette(
            routes=[
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/spillover/cluster", self.cluster, methods=["GET"]),
            ]
        )

    def _upstream(self, cloud: bool) -> httpx.AsyncClient:
        name = "cloud" if cloud else "local"
        if name not in self._clients:  # made on the loop that serves: uvicorn's thread or the test's
            if cloud and self._cloud_url:
                self._clients[name] = httpx.AsyncClient(base_url=self._cloud_url, timeout=30)
            else:
                transport = httpx.ASGITransport(self._local_app)
                self._clients[name] = httpx.AsyncClient(base_url="http://local", transport=transport, timeout=30)
        return self._clients[name]

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def cluster(self, request: Request) -> Response:
        replica = {"model": MODEL, "replica_id": "r1", "precision": "float32", "cpu_class": "avx2",
                   "numerics": "ok", "fault": None, "notes": []}  # fmt: skip
        return JSONResponse({"models": [MODEL], "replicas": [replica], "errors": []})

    async def chat(self, request: Request) -> Response:
        body = json.loads(await request.body())
        residency = request.headers.get(hdr.RESIDENCY)
        self.residencies.append(residency)
        cloud = residency == "local-sim"
        body["model"] = SIM_MODEL if cloud and self._cloud_url else MODEL
        route = {hdr.ROUTE: "cloud" if cloud else "local", hdr.TARGET: "cloud:cloud-sim" if cloud else f"local:{MODEL}"}
        client = self._upstream(cloud)
        upstream = await client.send(client.build_request("POST", "/v1/chat/completions", json=body), stream=True)
        if upstream.status_code != 200 or not body.get("stream"):
            content = await upstream.aread()
            await upstream.aclose()
            return Response(content, upstream.status_code, headers=route, media_type="application/json")

        async def relay() -> Any:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()

        return StreamingResponse(relay(), headers=route, media_type="text/event-stream")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serving(app: Any) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 15
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the fake gateway did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
