"""A /v1/completions request that bursts: cloud-sim's legacy completions API (bench/cloud_sim/completions_api.py),
the provider adapter's `completions` (only `COMPLETION_FIELDS` sent, errors as chat's), and the capability config
that lets a plan send a completion to a provider (`completions`, `echo`, `logprobs`; never to the Messages API)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cluster.config.cloud import CloudProvider
from router.errors import ProviderRejected, UpstreamError
from router.routing.capabilities import ProviderModel
from tests.unit.cloud_sim_client import client_for, make_sim, sse_payloads
from tests.unit.test_provider_openai_compat import KEY, collect, over_sim
from tests.unit.test_provider_openai_compat import make_sim as keyed_sim

COMPLETION = {"model": "local-a", "prompt": "The capital of France is", "max_tokens": 3}


async def test_the_sim_serves_the_legacy_api_beside_chat() -> None:
    async with client_for(make_sim()) as client:
        plain = await client.post("/v1/completions", json={**COMPLETION, "model": "sim-a"})
        streamed = await client.post("/v1/completions", json={**COMPLETION, "model": "sim-a", "stream": True,
                                                                "stream_options": {"include_usage": True}})  # fmt: skip
    body = plain.json()
    assert (plain.status_code, body["object"]) == (200, "text_completion")
    assert body["choices"][0] == {"index": 0, "text": "[cloud-sim:sim-a] The capital", "logprobs": None,
                                  "finish_reason": "length"}  # fmt: skip
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    events = [json.loads(p) for p in sse_payloads(streamed.text) if p != "[DONE]"]
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == body["choices"][0]["text"]
    assert events[-1]["usage"] == body["usage"] and streamed.text.endswith("data: [DONE]\n\n")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"echo": True}, "echo"),
        ({"logprobs": 2}, "logprobs"),
        ({"suffix": "!"}, "suffix"),
        ({"prompt": [1, 2, 3]}, "prompt"),  # token ids
        ({"prompt": ["a", "b"]}, "prompt"),  # several prompts
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
async def test_what_the_sim_does_not_serve_is_a_400_naming_the_field(extra: dict[str, Any], param: str) -> None:
    async with client_for(make_sim()) as client:
        reply = await client.post("/v1/completions", json={**COMPLETION, "model": "sim-a", **extra})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param


async def test_the_messages_api_sim_has_no_completions() -> None:
    async with client_for(make_sim(api="anthropic", models=("sim-claude",))) as client:
        reply = await client.post("/v1/completions", json={**COMPLETION, "model": "sim-claude"})
    assert reply.status_code == 404


async def test_the_adapter_sends_only_completion_fields(tmp_path: Path) -> None:
    log = tmp_path / "sim.jsonl"
    body = {**COMPLETION, "user": "u-1", "metadata": {"a": 1}, "best_of": 5, "messages": [], "top_k": 3}
    async with over_sim(keyed_sim(log)) as provider:
        reply = await provider.completions("local-a", body, "req-1")
        stream = await provider.completions("local-a", {**COMPLETION, "stream": True}, "req-2")
        events = await collect(stream)
    assert reply.body is not None and reply.body["choices"][0]["text"].startswith("[cloud-sim:sim-a]")
    assert events[-1] == "data: [DONE]\n\n"
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["path"] for r in rows] == ["/v1/completions", "/v1/completions"]
    assert rows[0]["headers"]["x-request-id"] == "req-1" and KEY not in log.read_text()


async def test_the_adapter_translates_errors_as_for_chat() -> None:
    async with over_sim(keyed_sim()) as provider:
        with pytest.raises(ProviderRejected) as caught:
            await provider.completions("local-a", {**COMPLETION, "echo": True}, "req-1")
    assert caught.value.status_code == 400 and "echo" in caught.value.message
    async with over_sim(keyed_sim(malformed_rate=1.0)) as provider:
        with pytest.raises(UpstreamError):
            await provider.completions("local-a", COMPLETION, "req-2")


MODEL = {"name": "m", "snapshot": "m-1", "context_window": 4096, "region": "r"}


def test_echo_and_logprobs_need_the_api_and_the_messages_api_has_none() -> None:
    assert ProviderModel(**MODEL, completions=True, echo=True, logprobs=True).echo
    with pytest.raises(ValidationError, match="require completions"):
        ProviderModel(**MODEL, echo=True)
    with pytest.raises(ValidationError, match="has no completions API"):
        CloudProvider(name="a", type="anthropic", base_url="https://api.anthropic.com/v1",
                      models={"x": {**MODEL, "completions": True}})  # fmt: skip
