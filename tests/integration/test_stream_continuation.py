"""Streams that finish, on the real stack, through the gateway with the official `openai` client:
a faulty cloud-sim and a healthy spare (cloud-sim-b), the Anthropic simulator as a third target.

Requests narrow to the simulators (`x-spillover-residency`, `x-spillover-providers`) so the faulty one
is tried first: under scenario `cheap` (L3, cost: continues streams, waits out a short Retry-After) the
cheapest allowed provider ranks first. Each test leaves the simulators fault-free and the gateway's
resilience state (breakers, health, learnt windows) reset.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.integration.conftest import CONTROL_HEADERS, Stack, reset_sims_and_resilience, wait_for_retry_budget

pytestmark = pytest.mark.integration
SMOL = "smollm2-135m-instruct"
WORDS = "tell me about the rivers and the mountains of France in a few words please".split()
SIMS = {"x-spillover-residency": "local-sim", "x-spillover-providers": "cloud-sim,cloud-sim-b"}
CHEAP = {**SIMS, "x-business-scenario": "cheap"}
WITH_ANTHROPIC = {
    "x-business-scenario": "cheap",
    "x-spillover-residency": "local-sim,sim-anthropic",
    "x-spillover-providers": "cloud-anthropic,cloud-sim,cloud-sim-b",
}


@pytest.fixture
def sims(stack: Stack) -> Iterator[dict[str, str]]:
    urls = {"faulty": stack.sim_url, "spare": stack.spare_url, "anthropic": stack.anthropic_url}
    yield {name: url.removesuffix("/v1") for name, url in urls.items()}
    reset_sims_and_resilience(stack, *urls.values())


def fault(sim: str, **settings: Any) -> None:
    httpx.post(f"{sim}/control/faults", json=settings, headers=CONTROL_HEADERS, timeout=10).raise_for_status()


def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.openai_base, api_key="unused", max_retries=0, timeout=60)


def stream(stack: Stack, headers: dict[str, str], **options: Any) -> tuple[str, list[Any], str]:
    """The streamed text, every chunk, and the request id."""
    request_id = f"finish-{uuid.uuid4().hex}"
    chunks = list(
        client(stack).chat.completions.create(
            model=SMOL,
            messages=[{"role": "user", "content": " ".join(WORDS)}],
            max_tokens=40,
            stream=True,
            extra_headers={**headers, "x-request-id": request_id},
            **options,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks, request_id


def record(stack: Stack, request_id: str) -> dict[str, Any]:
    response = httpx.get(f"{stack.openai_base}/spillover/decisions/{request_id}", timeout=10)
    response.raise_for_status()
    return response.json()


def continued_marker(chunks: list[Any]) -> dict[str, Any]:
    (marker,) = [c.model_extra["spillover"] for c in chunks if c.model_extra and "spillover" in c.model_extra]
    return dict(marker)


@pytest.mark.usefixtures("sims")
def test_a_stream_cut_mid_answer_is_continued_on_the_spare(stack: Stack, sims: dict[str, str]) -> None:
    whole, _, _ = stream(stack, CHEAP)  # the answer a stream that is not cut gives
    assert whole.split()[1:] == WORDS
    fault(sims["faulty"], midstream_cut_rate=1.0, cut_after_tokens=6)
    text, chunks, request_id = stream(stack, CHEAP, stream_options={"include_usage": True})
    assert text == whole  # one complete answer, no word lost or repeated
    marker = continued_marker(chunks)
    assert marker["from"] == f"cloud:cloud-sim/{SMOL}" and marker["to"] == f"cloud:cloud-sim-b/{SMOL}"
    assert marker["splice_after_chunks"] == 6 and text[: marker["splice_after_chars"]].split() == whole.split()[:6]
    assert len({c.id for c in chunks}) == 1
    (usage,) = [c.usage for c in chunks if c.usage is not None]
    assert usage.completion_tokens == len(whole.split())  # 6 streamed by the first, the rest by the spare
    facts = record(stack, request_id)
    assert [(a["target"], a["outcome"]) for a in facts["attempts"]] == [
        (f"cloud:cloud-sim/{SMOL}", "cut"),
        (f"cloud:cloud-sim-b/{SMOL}", "ok"),
    ]
    assert all(a["cost_usd"] > 0 for a in facts["attempts"])
    (splice,) = [e for e in facts["events"] if e["kind"] == "continued"]
    assert splice["splice_after_chars"] == marker["splice_after_chars"] and splice["error"] == "provider_cut"
    metrics = httpx.get(f"{stack.base_url}/metrics", timeout=10).text
    assert f'spillover_stream_repairs_total{{kind="continued",target="cloud:cloud-sim-b/{SMOL}"}}' in metrics


@pytest.mark.usefixtures("sims")
def test_a_fallback_that_refuses_the_prefill_is_passed_over(stack: Stack, sims: dict[str, str]) -> None:
    fault(sims["anthropic"], midstream_cut_rate=1.0, cut_after_tokens=4)
    fault(sims["faulty"], accepts_prefill=False)  # cloud-sim: declared with prefill, refuses it (400)
    text, chunks, request_id = stream(stack, WITH_ANTHROPIC)
    assert text.split()[0] == "[cloud-sim:sim-claude]" and text.split()[1:] == WORDS  # complete, every word once
    marker = continued_marker(chunks)
    assert marker["from"] == f"cloud:cloud-anthropic/{SMOL}" and marker["to"] == f"cloud:cloud-sim-b/{SMOL}"
    outcomes = [(a["target"], a["outcome"], a["error"]) for a in record(stack, request_id)["attempts"]]
    assert outcomes == [
        (f"cloud:cloud-anthropic/{SMOL}", "cut", "provider_cut"),
        (f"cloud:cloud-sim/{SMOL}", "error", "provider_rejected"),
        (f"cloud:cloud-sim-b/{SMOL}", "ok", None),
    ]


@pytest.mark.usefixtures("sims")
def test_when_nobody_can_continue_the_stream_ends_with_the_clean_error_event(
    stack: Stack, sims: dict[str, str]
) -> None:
    fault(sims["faulty"], midstream_cut_rate=1.0, cut_after_tokens=5)
    fault(sims["spare"], accepts_prefill=False)
    request_id = f"finish-{uuid.uuid4().hex}"
    received: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in client(stack).chat.completions.create(
            model=SMOL,
            messages=[{"role": "user", "content": " ".join(WORDS)}],
            max_tokens=40,
            stream=True,
            extra_headers={**CHEAP, "x-request-id": request_id},
        ):
            received.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    assert "".join(received).split()[1:] == WORDS[:4]  # what was streamed before the cut, once
    assert "127.0.0.1" not in str(caught.value.body)  # the clean error event: no host, no traceback
    (event,) = [e for e in record(stack, request_id)["events"] if e["kind"] == "not_continued"]
    assert event["error"] == "provider_cut" and "provider_rejected" in event["why"]


@pytest.mark.usefixtures("sims")
@pytest.mark.parametrize(
    ("setting", "repair"), [("malformed_event_rate", "skipped_events"), ("no_done_rate", "done_missing")]
)
def test_what_can_be_tolerated_finishes_the_stream(
    stack: Stack, sims: dict[str, str], setting: str, repair: str
) -> None:
    fault(sims["faulty"], **{setting: 1.0})
    text, chunks, request_id = stream(stack, SIMS, stream_options={"include_usage": True})  # default scenario (L2)
    assert text.split()[1:] == WORDS
    assert [c.usage.completion_tokens for c in chunks if c.usage is not None] == [len(WORDS) + 1]
    facts = record(stack, request_id)
    assert [a["target"] for a in facts["attempts"]] == [f"cloud:cloud-sim/{SMOL}"]  # no fail-over needed
    (event,) = [e for e in facts["events"] if e["kind"] == "stream_repaired"]
    assert event[repair] == 1


@pytest.mark.usefixtures("sims")
def test_a_prompt_too_long_for_one_provider_fails_over_to_a_larger_window(stack: Stack, sims: dict[str, str]) -> None:
    fault(sims["faulty"], context_window=3000)  # below its configured 32768: the provider says so
    long = " ".join(WORDS * 20)  # ~300 words; with max_tokens 3000 too long for 3000
    ids = [f"finish-ctx-{uuid.uuid4().hex}" for _ in range(2)]
    for request_id in ids:
        reply = client(stack).chat.completions.with_raw_response.create(
            model=SMOL,
            messages=[{"role": "user", "content": long}],
            max_tokens=3000,
            extra_headers={**CHEAP, "x-request-id": request_id},
        )
        assert reply.headers["x-spillover-target"] == "cloud:cloud-sim-b"
        content = reply.parse().choices[0].message.content or ""
        assert content.split()[1:] == (WORDS * 20)[:32]  # the sim echoes at most 32 words: answered in full
    first, second = (record(stack, i) for i in ids)
    assert [(a["target"], a["error"]) for a in first["attempts"]] == [
        (f"cloud:cloud-sim/{SMOL}", "context_length_exceeded"),
        (f"cloud:cloud-sim-b/{SMOL}", None),
    ]
    (learnt,) = [c for c in second["candidates"] if c["target"] == f"cloud:cloud-sim/{SMOL}"]
    assert learnt["status"] == "unavailable" and "too long for its window" in learnt["reason"]
    short = client(stack).chat.completions.with_raw_response.create(
        model=SMOL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, extra_headers=CHEAP
    )
    assert short.headers["x-spillover-target"] == "cloud:cloud-sim"  # a smaller request still goes there


@pytest.mark.usefixtures("sims")
def test_a_short_retry_after_is_waited_out_under_cost_and_failed_over_otherwise(
    stack: Stack, sims: dict[str, str]
) -> None:
    fault(sims["faulty"], rate_limit_rate=1.0, retry_after_s=1)
    quality = f"finish-ra-{uuid.uuid4().hex}"
    reply = client(stack).chat.completions.with_raw_response.create(
        model=SMOL, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
        extra_headers={**SIMS, "x-request-id": quality},
    )  # fmt: skip
    assert reply.headers["x-spillover-target"] == "cloud:cloud-sim-b"  # default scenario, quality: at once
    (choice,) = record(stack, quality)["events"]
    assert choice["wait"] is False and "strategy quality fails over" in choice["why"]
    httpx.post(f"{stack.base_url}/v1/spillover/resilience/reset", timeout=10).raise_for_status()
    wait_for_retry_budget(stack)  # the wait-out is a retry of the same target: the budget must grant it

    cost = f"finish-ra-{uuid.uuid4().hex}"

    def heal_after_the_first_429() -> None:  # the provider's limit resets within its Retry-After
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            rows = httpx.get(
                f"{sims['faulty']}/control/log", params={"x_request_id": cost}, headers=CONTROL_HEADERS, timeout=10
            ).json()
            if any(r["status"] == 429 for r in rows["rows"]):
                httpx.post(f"{sims['faulty']}/control/reset", headers=CONTROL_HEADERS, timeout=10).raise_for_status()
                return
            time.sleep(0.05)

    healer = threading.Thread(target=heal_after_the_first_429)
    healer.start()
    reply = client(stack).chat.completions.with_raw_response.create(
        model=SMOL, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
        extra_headers={**CHEAP, "x-request-id": cost},
    )  # fmt: skip
    healer.join()
    facts = record(stack, cost)  # in the message: why it failed over, when it does (seen once on a loaded machine)
    assert reply.headers["x-spillover-target"] == "cloud:cloud-sim", facts  # cheap, cost: waited and kept its target
    assert [(a["target"], a["outcome"]) for a in facts["attempts"]] == [
        (f"cloud:cloud-sim/{SMOL}", "error"),
        (f"cloud:cloud-sim/{SMOL}", "ok"),
    ]
    (choice,) = facts["events"]
    assert choice["wait"] is True and "strategy cost waits" in choice["why"]


def test_the_local_engine_takes_the_continuation_request_the_gateway_sends(stack: Stack) -> None:
    """Local models declare `prefill` (vLLM's chat API): the body a continuation sends — a trailing
    assistant message, continue_final_message, no generation prompt — is answered by the real engine
    as a continuation of that message."""
    messages = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is"},
    ]
    chunks = list(
        client(stack).chat.completions.create(
            model=SMOL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"continue_final_message": True, "add_generation_prompt": False},
            extra_headers={"x-spillover-residency": "local_only"},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "paris" in text.lower(), text  # it goes on from "... is", not a new turn
