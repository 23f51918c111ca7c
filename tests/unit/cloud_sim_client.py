"""An in-process cloud simulator and a client for it (through httpx.ASGITransport), shared by the
cloud-sim tests: a fixed clock, a recording sleep, and the chat bodies and SSE readers they use."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.cloud_sim import SimSettings, build_app
from bench.cloud_sim.server import CloudSim

QUESTION = "What is the capital of France?"


class RecordingSleep:
    """Records each requested delay; returns at once (or when `gate` opens)."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.calls: list[float] = []
        self.gate = gate

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(0)


def make_sim(log_path: Path | None = None, *, seed: int = 7, sleep: Any = None, **overrides: Any) -> CloudSim:
    settings = SimSettings(**{"models": ("sim-a", "sim-b"), "ttft_s": 0.0, "tokens_per_s": 0.0, **overrides})
    app = build_app(
        settings,
        rng=random.Random(seed),
        clock=lambda: 1_700_000_000.0,
        sleep=sleep or RecordingSleep(),
        log_path=log_path,
    )
    return app.state.cloud_sim


@asynccontextmanager
async def client_for(sim: CloudSim, **headers: str) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=sim.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim", headers=headers) as client:
        yield client


def chat(model: str = "sim-a", text: str = QUESTION, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


def sse_payloads(text: str) -> list[str]:
    return [block.removeprefix("data: ") for block in text.split("\n\n") if block]


def streamed_text(payloads: list[str]) -> str:
    chunks = [json.loads(p) for p in payloads if p != "[DONE]"]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
