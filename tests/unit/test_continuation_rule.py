"""router/resilience/continuation.py alone: what the client received, whether it may be continued, the
continuation request and the splice."""

from __future__ import annotations

import json
from typing import Any

from router.request.contract import derive_contract
from router.resilience.continuation import StreamSoFar, can_continue, may_continue, parse_events, prefill_body, splice
from router.routing.capabilities import ProviderModel, cloud_target
from router.routing.policy import Policy
from tests.unit.test_dispatch_continuation import caps

BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def event(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> str:
    chunk = {
        "id": "c1",
        "created": 7,
        "model": "x",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(chunk)}\n\n"


def test_one_chunk_may_carry_several_events_and_junk_is_left_out() -> None:
    text = event({"content": "a"}) + ": comment\n\n" + "data: {bad\n\n" + "data: [1]\n\n" + event({"content": "b"})
    assert [c["choices"][0]["delta"]["content"] for c in parse_events(text)] == ["a", "b"]
    so_far = StreamSoFar()
    so_far.see(text + "data: [DONE]\n\n")
    assert (
        so_far.streamed == "ab"
        and so_far.content_chunks == 2
        and so_far.first == {"id": "c1", "created": 7, "model": "x"}
    )


def contract(body: dict[str, Any]) -> Any:
    return derive_contract(body, {}, Policy(scenarios={"default": {"level": "L3"}}))


def test_the_rule() -> None:
    so_far = StreamSoFar()
    assert may_continue(contract(BODY), BODY, so_far, True) == "no text was streamed yet"
    so_far.see(event({"content": "Hello"}))
    assert may_continue(contract(BODY), BODY, so_far, True) is None
    assert "does not continue" in (may_continue(contract(BODY), BODY, so_far, False) or "")
    two = {**BODY, "n": 2}
    assert "several choices" in (may_continue(contract(two), two, so_far, True) or "")
    tool_call = StreamSoFar()
    tool_call.see(event({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}))
    tool_call.see(event({"content": "x"}))
    assert "tool call" in (may_continue(contract(BODY), BODY, tool_call, True) or "")
    so_far.see(event({}, "stop"))
    assert "after its finish_reason" in (may_continue(contract(BODY), BODY, so_far, True) or "")


def test_who_may_continue() -> None:
    assert can_continue(cloud_target("p", "m", ProviderModel(name="p-m", **caps(1.0))))
    assert not can_continue(cloud_target("p", "m", ProviderModel(name="p-m", **caps(1.0, prefill=False))))
    assert not can_continue(cloud_target("p", "m", "p-m"))  # capabilities unknown


def test_the_continuation_request() -> None:
    body = {**BODY, "max_tokens": 10, "max_completion_tokens": 3, "stream_options": {"include_usage": False}}
    sent = prefill_body(body, "The capital is ", 4)
    assert sent["messages"] == [*BODY["messages"], {"role": "assistant", "content": "The capital is"}]
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert sent["max_tokens"] == 6 and sent["max_completion_tokens"] == 1  # never below 1
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert body["messages"] == BODY["messages"]  # the client's body is left as it was


def test_the_splice() -> None:
    assert splice(" Paris", "The capital is ", first=True) == "Paris"
    assert splice(" Paris", "The capital is", first=True) == " Paris"
    assert splice(" and", "The capital is ", first=False) == " and"
