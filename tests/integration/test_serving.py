"""The real stack end to end, called with the official openai client (and raw httpx where
the wire format itself is asserted)."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.integration.conftest import Stack
from tests.integration.qwen_load import burst_on_kv, numerics_check_window_s

pytestmark = pytest.mark.integration

SMOL = "smollm2-135m-instruct"
QWEN = "qwen2-tiny-random"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.openai_base, api_key="not-needed", timeout=120, max_retries=0)


def test_capital_of_france(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model=SMOL, messages=FRANCE, temperature=0, max_tokens=30)
    completion = raw.parse()
    assert "Paris" in (completion.choices[0].message.content or "")
    assert raw.headers["x-spillover-target"] == f"local:{SMOL}"
    assert raw.headers["x-spillover-route"] == "local"
    assert len(raw.headers.get_list("x-request-id")) == 1


def test_streaming_same_text_in_chunks(client: openai.OpenAI, stack: Stack) -> None:
    whole = client.chat.completions.create(model=SMOL, messages=FRANCE, temperature=0, max_tokens=30)
    stream = client.chat.completions.create(model=SMOL, messages=FRANCE, temperature=0, max_tokens=30, stream=True)
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert len([p for p in pieces if p]) > 1
    assert "".join(pieces) == whole.choices[0].message.content

    body = {"model": SMOL, "messages": FRANCE, "temperature": 0, "max_tokens": 30, "stream": True}
    with httpx.stream("POST", f"{stack.openai_base}/chat/completions", json=body, timeout=120) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    text = "".join(json.loads(e[6:])["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert text == whole.choices[0].message.content


def test_models_lists_every_configured_model(client: openai.OpenAI, stack: Stack) -> None:
    listed = {m.id for m in client.models.list().data}
    assert listed == set(stack.config.served_names)  # local models and routes


def test_prefix_cache_reports_cached_tokens(client: openai.OpenAI) -> None:
    system = "You are a careful assistant. " + " ".join(
        f"Rule {i}: answer briefly, precisely and politely." for i in range(50)
    )
    usages = []
    for question in ("What is 2+2?", "Name a colour."):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        reply = client.chat.completions.create(model=SMOL, messages=messages, temperature=0, max_tokens=4)
        usages.append(reply.usage)
    first, second = usages
    assert first is not None and second is not None
    assert first.prompt_tokens > 500
    assert second.prompt_tokens_details is not None
    # The shared system prompt (hundreds of tokens) was served from the prefix cache.
    assert second.prompt_tokens_details.cached_tokens >= 256


def test_qwen2_architecture_serves(stack: Stack, client: openai.OpenAI) -> None:
    """Sent again while it bursts on its KV reading: the replica's own numerics check holds enough of the tiny
    model's KV blocks to read saturated on its 0.001 watermark (tests/integration/qwen_load.py `chat_until_local`)."""
    deadline = time.monotonic() + numerics_check_window_s(stack)
    while True:
        raw = client.chat.completions.with_raw_response.create(model=QWEN, messages=FRANCE, temperature=0, max_tokens=8)
        if not burst_on_kv(raw.headers) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    completion = raw.parse()
    assert raw.headers["x-spillover-target"] == f"local:{QWEN}", raw.headers.get("x-spillover-reason")
    assert completion.usage is not None and completion.usage.completion_tokens > 0  # random weights: text is noise
    card = next(m for m in client.models.list().data if m.id == QWEN)
    assert card.model_extra["metadata"]["family"] == "qwen"
    assert card.model_extra["metadata"]["synthetic"] is True


def test_completions_endpoint(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=SMOL, prompt="The capital of France is", temperature=0, max_tokens=5)
    assert reply.choices[0].text.strip() != ""


def test_health_and_readiness(stack: Stack) -> None:
    assert httpx.get(f"{stack.base_url}/healthz", timeout=10).status_code == 200
    for _ in range(30):  # polled, as a readiness probe is: a stats push can run late on a loaded machine
        ready = httpx.get(f"{stack.base_url}/readyz", timeout=30)
        if ready.status_code == 200:
            break
        time.sleep(1)
    assert ready.status_code == 200, ready.text
    assert ready.json()["models"] == {m.alias: "ok" for m in stack.config.models}


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "Traceback" not in response.text
    return error


def test_malformed_json_is_400(stack: Stack) -> None:
    response = httpx.post(f"{stack.openai_base}/chat/completions", content=b'{"model": ', timeout=30)
    assert _error(response, 400)["code"] == "invalid_json"


def test_missing_messages_is_400(stack: Stack) -> None:
    response = httpx.post(f"{stack.openai_base}/chat/completions", json={"model": SMOL}, timeout=30)
    assert _error(response, 400)["param"] == "messages"


def test_unknown_model_is_404_naming_models(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-17", messages=FRANCE)
    message = caught.value.body["message"]  # type: ignore[index]
    assert SMOL in message and QWEN in message


def test_prompt_beyond_local_context_goes_to_a_larger_window(client: openai.OpenAI) -> None:
    long_prompt = "hello " * 5000  # > 4096 tokens: SmolLM2 would have to truncate; cloud-sim has 32k
    raw = client.chat.completions.with_raw_response.create(
        model=SMOL, messages=[{"role": "user", "content": long_prompt}], max_tokens=8
    )
    assert raw.headers["x-spillover-route"] == "cloud"
    assert "context window 4096" in raw.headers["x-spillover-reason"]


def test_prompt_beyond_every_context_is_400_with_limits(client: openai.OpenAI) -> None:
    huge_prompt = "hello " * 40000  # beyond SmolLM2's 4096 and cloud-sim's 32768
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": huge_prompt}], max_tokens=8)
    body = caught.value.body
    assert body["code"] == "context_length_exceeded"  # type: ignore[index]
    assert "4096" in body["message"]  # type: ignore[index]
    clouds = {f"cloud:{p}/{SMOL}" for p in ("cloud-sim", "cloud-sim-b", "cloud-sim-badkey", "cloud-anthropic")}
    assert {r["target"] for r in body["reasons"]} == {f"local:{SMOL}", *clouds}  # type: ignore[index]


def test_max_tokens_beyond_context_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=SMOL, messages=FRANCE, max_tokens=100_000)
    assert "4096" in caught.value.body["message"]  # type: ignore[index]


def test_local_prompt_beyond_context_is_the_engines_400(stack: Stack) -> None:
    """local_only keeps it on SmolLM2; the gateway's estimate may pass, the engine's exact count
    rejects it, and the client hears the limits either way (never a truncated answer)."""
    body = {"model": SMOL, "messages": [{"role": "user", "content": "hello " * 5000}], "max_tokens": 8}
    headers = {"x-spillover-residency": "local_only"}
    response = httpx.post(f"{stack.openai_base}/chat/completions", json=body, headers=headers, timeout=60)
    assert response.status_code in (400, 422), response.text
    assert "4096" in response.text


def test_invalid_field_value_is_400(stack: Stack) -> None:
    body = {"model": SMOL, "messages": FRANCE, "temperature": "hot"}
    response = httpx.post(f"{stack.openai_base}/chat/completions", json=body, timeout=30)
    assert _error(response, 400)["param"] == "temperature"
