"""Tool calls answered by a local model, on the real stack (docs/routing.md, "Local tool calls").

The integration config runs qwen2-tiny-random with vLLM's `hermes` tool-call parser (`enable_auto_tool_choice`,
`tool_call_parser` in its `engine_args`; the parser of Qwen2.5 and of SmolLM2's tokenizer, which this model
shares), so the capability registry marks it tool-capable and tool requests stay local while it has room;
SmolLM2 has no parser and keeps sending them to the cloud (tests/integration/test_contracts.py). The answers go
through the same tool-call contract as a cloud's.

What the model emits (greedy, its weights random), as vLLM's hermes parser hands it on:
- a named `tool_choice`: a call whose `arguments` are the JSON string `""` — vLLM constrains the arguments to the
  tool's schema only for a tool marked `"strict": true`, and then this model fills the allowed whitespace to
  `max_tokens` (SmolLM2-135M under the same parser: `"gaben"` without `strict`, `{"city": "Paris"}` with it);
- `tool_choice: "required"` cut by `max_tokens`: the call as text (`<tool_call>\\n{"name": ...`), no tool_calls —
  streamed, a call whose arguments stop mid-JSON;
- `tool_choice: "auto"`: newlines and noise, no call.
So at L1 each local call here breaks its contract and fails over to cloud-sim, which answers valid arguments; at
L2 the local call reaches the client flagged (`x-spillover-contract`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import openai
import pytest

from tests.integration.conftest import Stack, final_record
from tests.integration.qwen_load import QWEN, numerics_check_window_s

pytestmark = pytest.mark.integration

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
LOCAL = f"local:{QWEN}"


@pytest.fixture
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.openai_base, api_key="unused", max_retries=0, timeout=120)


def tried_locally_first(
    stack: Stack, client: openai.OpenAI, prefix: str, **create: Any
) -> tuple[Any, str, list[dict[str, Any]]]:
    """A chat (raw response, id, the record's attempts) whose first attempt was the local model. The model's own
    numerics check holds a few KV blocks every interval, and on qwen2-tiny-random's tiny watermark that alone reads
    saturated (tests/integration/qwen_load.py): a request planned then bursts at once, as it should, and is sent
    again, within one check interval."""
    deadline = time.monotonic() + numerics_check_window_s(stack)
    while True:
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        headers = {"x-request-id": request_id, **create.pop("extra_headers", {})}
        raw = client.chat.completions.with_raw_response.create(**create, extra_headers=headers)
        parsed = raw.parse()
        if create.get("stream"):
            parsed = list(parsed)
        attempts = final_record(stack, request_id)["attempts"]
        if attempts[0]["target"] == LOCAL or time.monotonic() > deadline:
            return (raw, parsed), request_id, attempts
        create["extra_headers"] = {k: v for k, v in headers.items() if k != "x-request-id"}
        time.sleep(0.5)


def streamed_arguments(chunks: list[Any]) -> tuple[str, str | None]:
    """The tool-call arguments of a streamed answer, joined, and its finish reason."""
    pieces = [
        call.function.arguments or ""
        for chunk in chunks
        if chunk.choices
        for call in chunk.choices[0].delta.tool_calls or []
        if call.function is not None
    ]
    finish = next((c.choices[0].finish_reason for c in reversed(chunks) if c.choices), None)
    return "".join(pieces), finish


@pytest.mark.parametrize("stream", [False, True])
def test_a_local_call_that_breaks_its_schema_fails_over_at_l1(
    stack: Stack, client: openai.OpenAI, stream: bool
) -> None:
    (raw, parsed), _, attempts = tried_locally_first(
        stack, client, "local-tools-l1", model=QWEN, messages=ASK, tools=TOOLS, tool_choice=NAMED,
        max_tokens=40, temperature=0, stream=stream, extra_headers={"x-spillover-level": "L1"},
    )  # fmt: skip
    assert [(a["target"], a["outcome"]) for a in attempts] == [
        (LOCAL, "contract_violation"),
        (f"cloud:cloud-sim/{QWEN}", "ok"),
    ]
    assert any("get_weather arguments" in e for e in attempts[0]["contract_errors"]), attempts[0]
    assert raw.headers["x-spillover-target"] == "cloud:cloud-sim"
    assert "broke the output contract" in raw.headers["x-spillover-reason"]
    arguments = streamed_arguments(parsed)[0] if stream else parsed.choices[0].message.tool_calls[0].function.arguments
    assert '"city": "' in arguments  # cloud-sim's valid call, not the local one


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_call_answered_as_text_fails_over_at_l1(stack: Stack, client: openai.OpenAI, stream: bool) -> None:
    (raw, parsed), _, attempts = tried_locally_first(
        stack, client, "local-tools-required", model=QWEN, messages=ASK, tools=TOOLS, tool_choice="required",
        max_tokens=24, temperature=0, stream=stream, extra_headers={"x-spillover-level": "L1"},
    )  # fmt: skip
    assert [(a["target"], a["outcome"]) for a in attempts] == [
        (LOCAL, "contract_violation"),
        (f"cloud:cloud-sim/{QWEN}", "ok"),
    ]
    # non-streamed, the parser hands on the cut call as text; streamed, as a call whose arguments stop mid-JSON
    broke = "arguments are not JSON" if stream else "the answer has none"
    assert any(broke in e for e in attempts[0]["contract_errors"]), attempts[0]["contract_errors"]
    assert raw.headers["x-spillover-route"] == "cloud"
    if stream:
        arguments, finish = streamed_arguments(parsed)
        assert finish == "tool_calls" and '"city": "' in arguments
    else:
        assert parsed.choices[0].finish_reason == "tool_calls" and parsed.choices[0].message.tool_calls


@pytest.mark.parametrize("stream", [False, True])
def test_a_local_call_reaches_the_client_flagged_at_l2(stack: Stack, client: openai.OpenAI, stream: bool) -> None:
    (raw, parsed), _, attempts = tried_locally_first(
        stack, client, "local-tools-l2", model=QWEN, messages=ASK, tools=TOOLS, tool_choice=NAMED,
        max_tokens=40, temperature=0, stream=stream, extra_headers={"x-spillover-level": "L2"},
    )  # fmt: skip
    assert [(a["target"], a["outcome"]) for a in attempts] == [(LOCAL, "ok")]
    assert (raw.headers["x-spillover-route"], raw.headers["x-spillover-target"]) == ("local", LOCAL)
    assert attempts[0]["contract"].startswith("schema: ") and attempts[0]["contract_errors"]
    if stream:
        arguments, finish = streamed_arguments(parsed)
        assert finish in ("tool_calls", "stop", "length")
    else:
        assert raw.headers["x-spillover-contract"].startswith("schema: ")
        (call,) = parsed.choices[0].message.tool_calls
        arguments = call.function.arguments
        assert call.function.name == "get_weather"
    assert arguments == '""'  # what the model emitted, passed on as it came (module docstring)


def test_tool_choice_auto_stays_local_and_a_text_answer_is_an_answer(stack: Stack, client: openai.OpenAI) -> None:
    (raw, parsed), request_id, attempts = tried_locally_first(
        stack, client, "local-tools-auto", model=QWEN, messages=ASK, tools=TOOLS, max_tokens=8, temperature=0,
        extra_headers={"x-spillover-level": "L1"},
    )  # fmt: skip
    assert [(a["target"], a["outcome"]) for a in attempts] == [(LOCAL, "ok")]
    assert raw.headers["x-spillover-route"] == "local"
    assert not parsed.choices[0].message.tool_calls and parsed.choices[0].message.content is not None
    candidates = final_record(stack, request_id)["candidates"]
    assert all(c["status"] != "removed" for c in candidates if c["target"] == LOCAL)  # tool-capable
