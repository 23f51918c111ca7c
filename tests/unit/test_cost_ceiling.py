"""The per-request cost ceiling (`x-spillover-max-cost-usd`) across attempts: the estimate counts `n`
and, without max_tokens, the target's own output limit (which the upstream request then carries);
what earlier attempts spent is taken off the ceiling, and a fall-over it cannot pay for is skipped
with the reason, in the decision record's attempt and in the error when nothing is left."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.config.deployment import SpilloverConfig, parse_config
from router.errors import ContractViolation, InvalidRequest, NoCapableModel
from router.limits.budget import attempt_estimate_usd, bounded_body, ceiling_refusal, output_limit, spent_usd
from router.request.contract import MAX_N, derive_contract
from router.routing.capabilities import ProviderModel, cloud_target, local_target
from router.routing.policy import Policy
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from tests.fakes import FakeEngine, FakeProvider
from tests.unit.test_dispatch import SIM_M, World

PROMPT = {"model": "chat", "messages": [{"role": "user", "content": "x" * 40}]}  # ~10 + 4 tokens
PRICED = ProviderModel(
    name="p", snapshot="p-1", context_window=10_000, region="us", price_in_per_mtok=1.0, price_out_per_mtok=10.0
)


def contract(body: dict[str, Any], ceiling: str | None = "1") -> Any:
    headers = {"x-spillover-max-cost-usd": ceiling} if ceiling else {}
    return derive_contract({**PROMPT, **body}, headers, Policy())


def test_output_limit_is_max_tokens_else_the_targets_limit_else_its_window_less_the_prompt() -> None:
    limited = cloud_target("a", "chat", PRICED.model_copy(update={"max_output_tokens": 2000}))
    windowed = cloud_target("a", "chat", PRICED)
    assert output_limit(contract({"max_tokens": 50}), limited) == 50
    assert output_limit(contract({}), limited) == 2000
    assert output_limit(contract({}), windowed) == 10_000 - 14


def test_the_estimate_counts_every_choice() -> None:
    target = cloud_target("a", "chat", PRICED)
    one = attempt_estimate_usd(contract({"max_tokens": 100}), target)
    three = attempt_estimate_usd(contract({"max_tokens": 100, "n": 3}), target)
    assert one == pytest.approx((14 * 1 + 100 * 10) / 1e6)
    assert three == pytest.approx((14 * 1 + 300 * 10) / 1e6)


@pytest.mark.parametrize("n", [0, -1, MAX_N + 1, 10**30, True, "2", 2.0])
def test_a_bad_n_is_a_400_naming_n(n: Any) -> None:
    with pytest.raises(InvalidRequest) as caught:
        contract({"n": n})
    assert caught.value.param == "n" and caught.value.status_code == 400


def test_without_max_tokens_the_ceiling_checks_the_targets_output_limit() -> None:
    target = cloud_target("a", "chat", PRICED)
    # 50 output tokens would cost $0.0005, but the model may write ~9,986: $0.0999
    assert ceiling_refusal(contract({"max_tokens": 50}, "0.01"), target) is None
    why = ceiling_refusal(contract({}, "0.01"), target)
    assert why is not None and "estimated cost $0.0999 > max $0.0100" in why and "max_tokens 9986" in why


def test_earlier_spend_is_taken_off_the_ceiling() -> None:
    target = cloud_target("a", "chat", PRICED)
    c = contract({"max_tokens": 100}, "0.0015")  # estimate $0.001014
    assert ceiling_refusal(c, target, spent=0.0004) is None
    why = ceiling_refusal(c, target, spent=spent_usd([0.0003, None, 0.0003]))
    assert why == "estimated cost $0.001014 > remaining $0.000900 of max $0.001500 (earlier attempts spent $0.000600)"


def test_the_upstream_request_carries_the_limit_the_estimate_used() -> None:
    limited = cloud_target("a", "chat", PRICED.model_copy(update={"max_output_tokens": 2000}))
    body = {**PROMPT}
    assert bounded_body(body, contract({}, "1"), limited)["max_tokens"] == 2000
    assert bounded_body(body, contract({}, None), limited) is body  # no ceiling: untouched
    given = {**PROMPT, "max_completion_tokens": 7}
    assert bounded_body(given, contract({"max_completion_tokens": 7}, "1"), limited) is given
    assert bounded_body(body, contract({}, "1"), local_target("m", {})) is body  # local: no price


# --- across attempts, through the real dispatcher ---------------------------------------------------

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
JSON_CHAT = {**PROMPT, "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}}


def two_clouds() -> SpilloverConfig:
    caps = {**SIM_M, "price_in_per_mtok": 1.0, "price_out_per_mtok": 10.0, "max_output_tokens": 1000}
    return parse_config(
        {
            "models": [],
            "cloud": {
                "providers": [
                    {"name": "a", "base_url": "http://127.0.0.1:1/v1", "models": {"chat": caps}},
                    {"name": "b", "base_url": "http://127.0.0.1:2/v1", "models": {"chat": caps}},
                ]
            },
            "routes": [{"alias": "chat", "targets": ["cloud:a/chat", "cloud:b/chat"]}],
        },
        "ceiling",
    )


async def dispatch(config: SpilloverConfig, a: FakeProvider, b: FakeProvider, body: dict[str, Any], **headers: str):
    world = World()
    d = Dispatcher(
        config, FakeEngine(), {"a": a, "b": b}, world.snapshot, clocks=Clocks.of(world.clock, sleep=world.sleep)
    )
    c = derive_contract(body, headers, config.policy)
    try:
        return await d.dispatch("chat", body, "r", contract=c, deadline_s=5), d
    except Exception as exc:
        exc.dispatcher = d  # type: ignore[attr-defined]
        raise


async def test_a_fall_over_the_remaining_ceiling_cannot_pay_for_is_skipped_and_named_in_the_error() -> None:
    # a answers 800 tokens that break the L1 schema: $0.008014 spent; b's estimate ($0.010014, 1000 tokens)
    # fits the $0.015 ceiling alone, but not the $0.006986 left
    a = FakeProvider("a", answer="not json", usage={"prompt_tokens": 14, "completion_tokens": 800})
    b = FakeProvider("b", answer='{"city": "Paris"}')
    headers = {"x-spillover-max-cost-usd": "0.015", "x-spillover-level": "L1"}
    with pytest.raises(ContractViolation) as caught:
        await dispatch(two_clouds(), a, b, {**JSON_CHAT, "max_tokens": 1000}, **headers)
    assert b.calls == []
    message = caught.value.message
    assert "then cloud:b/chat skipped: max cost: estimated cost $0.0100 > remaining $0.006986" in message
    record = caught.value.dispatcher.decisions.get("r")  # type: ignore[attr-defined]
    assert [(x.target, x.outcome) for x in record.attempts] == [
        ("cloud:a/chat", "contract_violation"),
        ("cloud:b/chat", "skipped"),
    ]
    assert record.attempts[0].cost_usd == pytest.approx(0.008014)
    assert record.attempts[1].error.startswith("max cost: estimated cost $0.0100 > remaining $0.006986 of max")


async def test_a_fall_over_within_what_is_left_is_tried() -> None:
    a = FakeProvider("a", answer="not json", usage={"prompt_tokens": 14, "completion_tokens": 100})
    b = FakeProvider("b", answer='{"city": "Paris"}')
    headers = {"x-spillover-max-cost-usd": "0.015", "x-spillover-level": "L1"}
    done, d = await dispatch(two_clouds(), a, b, {**JSON_CHAT, "max_tokens": 1000}, **headers)
    assert done.target == "cloud:b"
    assert [x.outcome for x in d.decisions.get("r").attempts] == ["contract_violation", "ok"]


async def test_without_max_tokens_the_upstream_request_carries_the_targets_limit() -> None:
    a, b = FakeProvider("a"), FakeProvider("b")
    done, _ = await dispatch(two_clouds(), a, b, dict(PROMPT), **{"x-spillover-max-cost-usd": "0.05"})
    assert done.target == "cloud:a" and a.bodies[0]["max_tokens"] == 1000
    done, _ = await dispatch(two_clouds(), a, b, dict(PROMPT))
    assert "max_tokens" not in a.bodies[1]  # no ceiling: the body as the client sent it


CEILING = {"x-spillover-max-cost-usd": "0.015"}


async def test_n_choices_can_put_every_target_over_the_ceiling() -> None:
    body = {**PROMPT, "max_tokens": 1000, "n": 2}  # 2 x 1000 x $10/Mtok = $0.02 > $0.015
    with pytest.raises(NoCapableModel) as caught:
        await dispatch(
            two_clouds(), FakeProvider("a"), FakeProvider("b"), body, **{"x-spillover-max-cost-usd": "0.015"}
        )
    assert all(r["filter"] == "cost" and "2 × max_tokens 1000" in r["reason"] for r in caught.value.reasons)


def test_without_max_tokens_a_small_output_limit_does_not_remove_the_target() -> None:
    from router.routing.filters import max_output
    from router.routing.plugins import UNKNOWN_STATE

    small = cloud_target("a", "chat", PRICED.model_copy(update={"max_output_tokens": 4}))
    assert max_output(contract({}, None), small, UNKNOWN_STATE) is None  # the gateway's default is no request
    assert max_output(contract({"max_tokens": 5}, None), small, UNKNOWN_STATE) == "max output tokens 4 < max_tokens 5"
