"""The dispatcher with contracts: capability routing, output contracts, decision records."""

from __future__ import annotations

import pytest

from cluster.config.deployment import parse_config
from router.errors import ContractViolation, NoCapableModel, NoTargetFitsContext
from tests.fakes import FakeEngine, FakeProvider
from tests.unit.test_dispatch import CHAT, SIM_M, World, dispatcher, make_config, run


@pytest.fixture
def world() -> World:
    return World()


def answering(content: str) -> FakeEngine:
    """A local engine whose chat answer is `content` (to exercise output contracts)."""
    return FakeEngine(answer=content, usage={"prompt_tokens": 9})


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
JSON_BODY = {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}}
TOOLS_BODY = {
    **CHAT,
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
}


async def test_tools_request_goes_to_capable_cloud_even_with_local_room(world: World) -> None:
    local, cloud = FakeEngine(), FakeProvider()
    done = await run(dispatcher(world, local=local, cloud=cloud), "chat", TOOLS_BODY, "r-20")
    assert (done.route, done.target) == ("cloud", "cloud:sim")
    assert done.reason.startswith("local m cannot serve this request") and "tool" in done.reason
    assert local.calls == []


async def test_no_target_with_tools_is_422_with_reasons(world: World) -> None:
    config = parse_config(
        {
            **make_config().model_dump(mode="json"),
            "cloud": {
                "providers": [
                    {"name": "sim", "base_url": "http://127.0.0.1:1/v1", "models": {"m": {**SIM_M, "tools": False}}}
                ]
            },
        },
        "t",
    )
    with pytest.raises(NoCapableModel) as caught:
        await run(dispatcher(world, config), "chat", TOOLS_BODY, "r-21")
    body = caught.value.to_openai()["error"]
    assert caught.value.status_code == 422 and body["code"] == "no_capable_model"
    assert {r["target"] for r in body["reasons"]} == {"local:m", "cloud:sim/m"}
    assert "127.0.0.1" not in str(body)


async def test_prompt_beyond_local_context_goes_to_larger_window(world: World) -> None:
    long_body = {"messages": [{"role": "user", "content": "word " * 5000}], "max_tokens": 100}
    done = await run(dispatcher(world), "chat", long_body, "r-22")
    assert done.route == "cloud" and "context window 4096" in done.reason


async def test_prompt_beyond_every_context_is_400_context_length(world: World) -> None:
    huge = {"messages": [{"role": "user", "content": "word " * 40000}], "max_tokens": 100}
    with pytest.raises(NoTargetFitsContext) as caught:
        await run(dispatcher(world), "chat", huge, "r-23")
    assert caught.value.status_code == 400 and caught.value.code == "context_length_exceeded"


async def test_l1_invalid_local_json_retries_on_cloud(world: World) -> None:
    local, cloud = answering("no json here"), FakeProvider(answer='{"city": "Paris"}')
    d = dispatcher(world, local=local, cloud=cloud)
    done = await run(d, "chat", JSON_BODY, "r-24", x_spillover_level="L1")
    assert done.route == "cloud" and "broke the output contract" in done.reason
    assert done.reply.body["choices"][0]["message"]["content"] == '{"city": "Paris"}'  # type: ignore[index]
    record = d.decisions.get("r-24")
    assert record is not None and [a.outcome for a in record.attempts] == ["contract_violation", "ok"]
    assert record.chosen == "cloud:sim"


async def test_l1_never_uses_a_retaining_provider(world: World) -> None:
    config = parse_config(
        {
            **make_config().model_dump(mode="json"),
            "cloud": {
                "providers": [
                    {
                        "name": "sim",
                        "base_url": "http://127.0.0.1:1/v1",
                        "models": {"m": {**SIM_M, "data_policy": "retention"}},
                    }
                ]
            },
        },
        "t",
    )
    cloud = FakeProvider(answer='{"city": "Paris"}')
    with pytest.raises(ContractViolation):
        await run(
            dispatcher(world, config, local=answering("nope"), cloud=cloud),
            "chat",
            JSON_BODY,
            "r-28",
            x_spillover_level="L1",
        )
    assert cloud.calls == []


async def test_l1_invalid_everywhere_is_502_contract_violation(world: World) -> None:
    d = dispatcher(world, local=answering("nope"), cloud=FakeProvider(answer='{"town": 1}'))
    with pytest.raises(ContractViolation) as caught:
        await run(d, "chat", JSON_BODY, "r-25", x_spillover_level="L1")
    assert caught.value.status_code == 502 and caught.value.to_openai()["error"]["errors"]


async def test_json_in_surrounding_text_is_repaired(world: World) -> None:
    d = dispatcher(world, local=answering('Sure! {"city": "Paris"} Anything else?'))
    done = await run(d, "chat", JSON_BODY, "r-26", x_spillover_level="L1")
    assert done.route == "local" and done.headers == {"x-spillover-contract": "repaired"}
    assert done.reply.body["choices"][0]["message"]["content"] == '{"city": "Paris"}'  # type: ignore[index]


async def test_l2_violation_passes_with_warning(world: World) -> None:
    done = await run(dispatcher(world, local=answering("plain text")), "chat", JSON_BODY, "r-27")
    assert done.route == "local" and "x-spillover-contract" in done.headers
