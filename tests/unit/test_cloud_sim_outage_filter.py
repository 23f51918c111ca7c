"""cloud-sim's `outage` and `content_filter` settings (in-process through httpx.ASGITransport), and
that the provider adapter turns them into what the gateway's failure table expects: a server
error (retried, failed over, counted against health) and a client rejection with the provider's
reason (returned to the client, never held against the provider)."""

from __future__ import annotations

import httpx
import pytest

from bench.cloud_sim.replies import CONTENT_FILTERED
from cluster.config.cloud import CloudProvider
from router.errors import ProviderRejected, UpstreamError
from router.resilience.failure import FailureClass, classify
from serve_apps.providers import OpenAICompatProvider
from tests.unit.cloud_sim_client import chat, client_for, make_sim


async def test_an_outage_answers_503_on_chat_and_models_but_not_healthz() -> None:
    sim = make_sim(outage=True)
    async with client_for(sim) as client:
        answered = await client.post("/v1/chat/completions", json=chat())
        models = await client.get("/v1/models")
        healthz = await client.get("/healthz")
    assert (answered.status_code, models.status_code, healthz.status_code) == (503, 503, 200)
    assert answered.json()["error"]["type"] == "server_error"


async def test_the_content_filter_rejects_matching_prompts_with_the_providers_reason() -> None:
    sim = make_sim(content_filter="forbidden|secret plan")
    async with client_for(sim) as client:
        filtered = await client.post("/v1/chat/completions", json=chat(text="Tell me the SECRET PLAN."))
        parts = [{"type": "text", "text": "a forbidden topic"}]
        filtered_parts = await client.post(
            "/v1/chat/completions", json={"model": "sim-a", "messages": [{"role": "user", "content": parts}]}
        )
        fine = await client.post("/v1/chat/completions", json=chat(text="What is the weather?"))
    assert filtered.status_code == filtered_parts.status_code == 400
    assert filtered.json()["error"] == {
        "message": CONTENT_FILTERED,
        "type": "invalid_request_error",
        "param": "prompt",
        "code": "content_filter",
    }
    assert fine.status_code == 200


@pytest.mark.parametrize(
    ("update", "field"),
    [
        ({"content_filter": "([unclosed"}, "content_filter"),
        ({"content_filter": "x" * 201}, "content_filter"),
        ({"outage": "sometimes"}, "outage"),
    ],
)
async def test_bad_settings_are_400_and_change_nothing(update: dict[str, object], field: str) -> None:
    sim = make_sim()
    async with client_for(sim) as client:
        response = await client.post("/control/faults", json=update)
        after = await client.post("/v1/chat/completions", json=chat())
    assert response.status_code == 400 and field in response.json()["error"]["message"]
    assert after.status_code == 200


def _provider(sim: object) -> OpenAICompatProvider:
    config = CloudProvider(name="sim", base_url="http://sim/v1", models={"m": "sim-a"})
    return OpenAICompatProvider(config, transport=httpx.ASGITransport(app=sim.app))  # type: ignore[attr-defined]


async def test_the_adapter_classes_an_outage_as_a_server_error_and_a_filter_as_a_client_rejection() -> None:
    async with _provider(make_sim(outage=True)) as down:
        with pytest.raises(UpstreamError) as outage:
            await down.chat("m", chat(model="m"), "r1")
        with pytest.raises(UpstreamError) as models:
            await down.probe()
    assert classify(outage.value) is classify(models.value) is FailureClass.SERVER
    async with _provider(make_sim(content_filter="forbidden")) as filtering:
        with pytest.raises(ProviderRejected) as rejected:
            await filtering.chat("m", chat(model="m", text="the forbidden topic"), "r2")
    assert classify(rejected.value) is FailureClass.CLIENT
    assert rejected.value.status_code == 400 and CONTENT_FILTERED in rejected.value.message
