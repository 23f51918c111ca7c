"""`spillover cloud-sim --api anthropic` as a real subprocess, called over real TCP by the
AnthropicProvider: what ASGI-level tests cannot show — a TCP reset before any byte, and a
non-streamed body cut mid-way — becomes the same errors as for an OpenAI-compatible provider, and
the Messages API's 529 reaches the gateway as `provider_overloaded`."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from bench.cloud_sim.process import running_cloud_sim
from cluster.config.cloud import CloudProvider
from router.errors import ProviderOverloaded, UpstreamError
from serve_apps.providers import provider_for

KEY = "sk-ant-real-sim"
BODY = {"model": "m", "messages": [{"role": "user", "content": "What is the capital of France?"}]}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    args = ["--api", "anthropic", "--ttft-s", "0.01", "--tokens-per-s", "1000", "--api-key", KEY]
    with running_cloud_sim(_free_port(), ["sim-claude"], extra_args=args) as url:
        yield url


@pytest.fixture
def faults(sim_url: str) -> Iterator[str]:
    control = sim_url.removesuffix("/v1") + "/control"
    yield f"{control}/faults"
    httpx.post(f"{control}/reset", headers={"x-api-key": KEY}, timeout=5).raise_for_status()


def provider(url: str) -> CloudProvider:
    entry = {"name": "sim-claude", "snapshot": "s", "context_window": 8192, "region": "eu"}
    return CloudProvider(name="anth", type="anthropic", base_url=url, api_key_env="K", timeout_s=5, models={"m": entry})


async def test_json_and_stream_over_real_tcp(sim_url: str) -> None:
    async with provider_for(provider(sim_url), env={"K": KEY}) as anth:
        whole = await anth.chat("m", dict(BODY), "r1")
        stream = await anth.chat("m", {**BODY, "stream": True}, "r2")
        assert stream.chunks is not None
        events = [e async for e in stream.chunks]
    assert whole.body is not None and whole.body["choices"][0]["message"]["content"].endswith("France?")
    assert events[-1] == "data: [DONE]\n\n" and len(events) > 3


@pytest.mark.parametrize(
    ("fault", "codes"),
    [
        ({"reset_rate": 1.0}, {"provider_unreachable"}),
        ({"midstream_cut_rate": 1.0}, {"provider_cut", "provider_malformed"}),
        ({"error_5xx_rate": 1.0}, {"provider_overloaded", "provider_error"}),
    ],
)
async def test_faults_over_real_tcp(faults: str, fault: dict[str, float], codes: set[str]) -> None:
    httpx.post(faults, json=fault, headers={"x-api-key": KEY}, timeout=5).raise_for_status()
    seen = set()
    async with provider_for(provider(faults.removesuffix("/control/faults") + "/v1"), env={"K": KEY}) as anth:
        for i in range(8 if "error_5xx_rate" in fault else 1):
            with pytest.raises(UpstreamError) as caught:
                await anth.chat("m", dict(BODY), f"f{i}")
            seen.add(caught.value.code)
            if isinstance(caught.value, ProviderOverloaded):
                assert caught.value.status_code == 503
    assert seen <= codes and seen
    if "error_5xx_rate" in fault:
        assert "provider_overloaded" in seen
