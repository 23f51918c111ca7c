"""Provider answers that are facts about the target: a prompt too long for its window (OpenAI's 400
`context_length_exceeded`, the Messages API's 400 "prompt is too long") and an assistant prefill,
continued or refused — against the cloud simulator, which answers them the way those APIs do."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from router.errors import ProviderContextExceeded, ProviderRejected
from router.resilience.failure import FailureClass, classify
from serve_apps.providers.capability_errors import context_exceeded
from tests.unit import test_provider_anthropic as anth
from tests.unit import test_provider_openai_compat as oai

LONG = {**oai.BODY, "max_tokens": 50}


@pytest.mark.parametrize("side", [oai, anth])
async def test_a_prompt_too_long_for_the_window_is_a_capability_error(side: Any) -> None:
    async with side.over_sim(side.make_sim(context_window=20)) as provider:
        with pytest.raises(ProviderContextExceeded) as caught:
            await provider.chat("local-a", LONG, "req-1")
    assert caught.value.status_code == 400 and caught.value.code == "context_length_exceeded"
    assert classify(caught.value) is FailureClass.CAPABILITY
    async with side.over_sim(side.make_sim(context_window=100)) as provider:
        assert (await provider.chat("local-a", LONG, "req-1")).body is not None  # it fits: answered


@pytest.mark.parametrize("side", [oai, anth])
async def test_other_400s_still_go_back_to_the_client(side: Any) -> None:
    async with side.over_sim(side.make_sim(content_filter="capital")) as provider:
        with pytest.raises(ProviderRejected) as caught:
            await provider.chat("local-a", LONG, "req-1")
    assert not isinstance(caught.value, ProviderContextExceeded)
    assert classify(caught.value) is FailureClass.CLIENT


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (400, {"error": {"code": "context_length_exceeded", "message": "too long"}}, True),
        (
            400,
            {"type": "error", "error": {"type": "invalid_request_error", "message": "Prompt is too long: 9 > 8"}},
            True,
        ),
        (400, {"error": {"type": "invalid_request_error", "message": "max_tokens: prompt is too long"}}, False),
        (400, {"error": {"type": "server_error", "message": "prompt is too long"}}, False),
        (422, {"error": {"code": "context_length_exceeded"}}, False),
        (400, {"error": "context_length_exceeded"}, False),
        (400, ["context_length_exceeded"], False),
        (400, "not json at all {", False),
    ],
)
def test_only_these_answers_are_context_errors(status: int, body: Any, expected: bool) -> None:
    content = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    assert context_exceeded(status, content) is expected


PREFILLED = {
    "model": "local-a",
    "messages": [*oai.BODY["messages"], {"role": "assistant", "content": "[cloud-sim:sim-a] What is"}],
    "continue_final_message": True,
    "add_generation_prompt": False,
}


async def test_a_prefill_is_continued_where_it_stopped() -> None:
    async with oai.over_sim(oai.make_sim()) as provider:
        whole = (await provider.chat("local-a", oai.BODY, "req-1")).body
        continued = (await provider.chat("local-a", PREFILLED, "req-2")).body
    assert whole is not None and continued is not None
    text = whole["choices"][0]["message"]["content"]
    assert "[cloud-sim:sim-a] What is" + continued["choices"][0]["message"]["content"] == text


@pytest.mark.parametrize("side", [oai, anth])
async def test_a_target_without_prefill_refuses_it_as_a_client_error(side: Any) -> None:
    async with side.over_sim(side.make_sim(accepts_prefill=False)) as provider:
        with pytest.raises(ProviderRejected) as caught:
            await provider.chat("local-a", PREFILLED, "req-1")
        assert (await provider.chat("local-a", oai.BODY, "req-2")).body is not None  # no prefill: answered
    assert caught.value.status_code == 400 and classify(caught.value) is FailureClass.CLIENT


async def test_the_messages_api_refuses_a_prefill_ending_in_whitespace() -> None:
    trailing = {**PREFILLED, "messages": [*oai.BODY["messages"], {"role": "assistant", "content": "The "}]}
    async with anth.over_sim(anth.make_sim()) as provider:
        with pytest.raises(ProviderRejected) as caught:
            await provider.chat("local-a", trailing, "req-1")
    assert "trailing whitespace" in caught.value.message


async def test_the_prefill_fields_are_forwarded_only_as_booleans() -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        reply = {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {"content": "ok"}}]}
        return httpx.Response(200, json=reply)

    async with oai.over_handler(handler) as provider:
        await provider.chat("local-a", PREFILLED, "req-1")
        hostile = {**oai.BODY, "continue_final_message": "yes", "add_generation_prompt": {"a": 1}}
        await provider.chat("local-a", hostile, "req-2")
    assert sent[0]["continue_final_message"] is True and sent[0]["add_generation_prompt"] is False
    assert "continue_final_message" not in sent[1] and "add_generation_prompt" not in sent[1]
