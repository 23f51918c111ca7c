"""Hostile input on the surfaces streams-that-finish added: config keys (`continue_streams`, a model
entry's `prefill`, `retry_after_wait_max_s`, `retry_after_wait_strategies`), the cloud simulator's new
settings over `POST /control/faults`, and a client's own continuation fields."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cluster.config.deployment import parse_config
from router.errors import ConfigError
from router.request.contract import derive_contract
from tests.unit.cloud_sim_client import chat, client_for, make_sim
from tests.unit.test_dispatch_continuation import ANSWER, BODY, World, caps

MINIMAL = {"models": [{"alias": "m", "source": "prepared:smollm2-135m-instruct", "family": "llama"}]}
PROVIDER = {"name": "p", "base_url": "http://127.0.0.1:1/v1"}


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"policy": {"scenarios": {"default": {"continue_streams": "sometimes"}}}}, "continue_streams"),
        ({"policy": {"scenarios": {"default": {"continue_streams": [True]}}}}, "continue_streams"),
        (
            {"cloud": {"providers": [{**PROVIDER, "models": {"m": {"name": "x", **caps(1.0, prefill="maybe")}}}]}},
            "prefill",
        ),
        ({"resilience": {"retry": {"retry_after_wait_max_s": -1}}}, "retry_after_wait_max_s"),
        ({"resilience": {"retry": {"retry_after_wait_max_s": 1e9}}}, "retry_after_wait_max_s"),
        ({"resilience": {"retry": {"retry_after_wait_max_s": "nan"}}}, "retry_after_wait_max_s"),
        ({"resilience": {"retry": {"retry_after_wait_strategies": ["cheapest"]}}}, "retry_after_wait_strategies"),
        ({"resilience": {"retry": {"retry_after_wait_strategies": "cost"}}}, "retry_after_wait_strategies"),
    ],
)
def test_bad_config_values_name_the_field(patch: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({**MINIMAL, **patch}, "deploy.yaml")
    assert field in str(caught.value)


def test_the_defaults() -> None:
    config = parse_config(MINIMAL, "deploy.yaml")
    assert config.resilience.retry.retry_after_wait_max_s == 2.0
    assert config.resilience.retry.retry_after_wait_strategies == ["cost"]
    scenario = config.policy.scenarios["default"]
    assert scenario.continue_streams is None
    assert [scenario.continues_streams(level) for level in ("L1", "L2", "L3")] == [False, True, True]


BAD_SETTINGS = [
    {"cut_after_tokens": 0},
    {"cut_after_tokens": "many"},
    {"context_window": -5},
    {"accepts_prefill": "nope"},
    {"malformed_event_rate": 1.5},
    {"no_done_rate": 0.7, "malformed_event_rate": 0.7},  # rates add up past 1
]


async def test_the_simulators_new_settings_refuse_bad_values() -> None:
    async with client_for(make_sim()) as client:
        for bad in BAD_SETTINGS:
            rejected = await client.post("/control/faults", json=bad)
            assert rejected.status_code == 400 and rejected.json()["error"]["code"] == "invalid_settings", bad
        answer = await client.post("/v1/chat/completions", json=chat())
        assert answer.status_code == 200  # nothing of the bad updates stuck


async def test_a_clients_own_prefill_is_its_own_business_and_never_a_continuation() -> None:
    w = World()
    body = {
        **BODY,
        "messages": [*BODY["messages"], {"role": "assistant", "content": "The capital"}],
        "continue_final_message": "yes",  # the wrong type: never forwarded to a provider
    }
    contract = derive_contract({"model": "m", **body}, {"x-business-scenario": "chat"}, w.config.policy)
    done = await w.dispatcher.dispatch("chat", body, "r1", contract=contract, deadline_s=30)
    assert done.reply.chunks is not None
    events = [e async for e in done.reply.chunks]
    text = "".join(
        json.loads(e.removeprefix("data: "))["choices"][0]["delta"].get("content") or ""
        for e in events
        if e != "data: [DONE]\n\n"
    )
    assert text == ANSWER  # answered as a new turn: "yes" is no continuation request
    assert w.record("r1").events == ()
