"""Feedback cannot steer other tenants: through the gateway's real HTTP layer (real dispatcher, decision
store, authenticator, learning state and typer; FakeEngine as the local model), one tenant's flood of
verdicts under ever new `source` names, and its labels, move only its own routing and typing; an admin's
move everyone's, each tenant's weighted."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from cluster.config.deployment import parse_config
from cluster.config.tenants import authenticator_for
from router.routing.snapshot import ClusterSnapshot, ReplicaStats
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.interfaces import NoObserver
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.gateway_parts import EdgeSettings, GatewayParts
from serve_apps.http.surface import GatewayHTTP, ServedModel
from serve_apps.learning.routes import LearningRoutes
from serve_apps.learning.state import Learning
from tests.fakes import FakeClock, FakeEngine
from tests.unit.security_gateway import APPS, BOUND_S, KEYS, MODEL, OPS, OTHER, config

FEEDBACK = "/v1/spillover/feedback"
LOCAL = f"local:{MODEL}"
BUCKET = "task=default|lang=latin|len=short|tools=0|risk=L2"
EXAMPLES = {
    "private": ["my patient's medical diagnosis and treatment", "the patient medical history and prescription"],
    "extraction": ["extract the fields as json from this invoice", "pull the names and dates out as json"],
}
MEDICAL = "summarise the patient medical diagnosis and treatment history"


def build(learning: dict[str, Any]) -> tuple[httpx.AsyncClient, Learning, FakeClock]:
    raw = config().model_dump(mode="json")
    raw["learning"] = learning
    cfg = parse_config(raw, "test")
    replica = ReplicaStats(MODEL, "r1", "n1", 0.0, 0.1, 0, 0, 0, 0, 364, 128)
    snapshot = ClusterSnapshot(taken_at=0.0, replicas=(replica,), max_age_s=1e12)
    monotonic = FakeClock()  # the feedback rate's clock: the test moves it
    state = Learning.from_config(cfg, clock=lambda: 1234.5, monotonic=monotonic)
    local = FakeEngine(answer="ok")
    dispatcher = Dispatcher(
        cfg,
        local,
        {},
        lambda: snapshot,
        clocks=Clocks.of(lambda: 0.0),
        parts=DispatchParts(observer=state.observer(NoObserver()), quality=state.quality),
    )
    http = GatewayHTTP(
        local,
        [ServedModel(MODEL, "llama", "cpu", 4096)],
        dispatcher,
        created=1,
        edge=EdgeSettings(authenticator=authenticator_for(cfg, KEYS)),
        parts=GatewayParts(
            policy=cfg.policy, decisions=dispatcher.decisions, learning=LearningRoutes(state, dispatcher.decisions)
        ),
    )
    transport = httpx.ASGITransport(app=http.app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=BOUND_S), state, monotonic


async def chat(client: httpx.AsyncClient, request_id: str, headers: dict[str, str], text: str = "hi") -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    reply = await client.post("/v1/chat/completions", json=body, headers={**headers, "x-request-id": request_id})
    assert reply.status_code == 200, reply.text


async def record(client: httpx.AsyncClient, request_id: str, headers: dict[str, str]) -> dict[str, Any]:
    reply = await client.get(f"/v1/spillover/decisions/{request_id}", headers=headers)
    assert reply.status_code == 200, reply.text
    found: dict[str, Any] = reply.json()
    return found


def quality_used(decision: dict[str, Any]) -> float:
    (local,) = [c for c in decision["candidates"] if c["target"] == LOCAL]
    return float(local["scores"]["quality"]["raw"])


def test_feedback_steers_only_its_tenant_one_verdict_per_source_kind_and_bounded_rate() -> None:
    async def go() -> None:
        client, learning, monotonic = build({"quality": {"min_samples": 2}, "feedback": {"per_tenant_per_minute": 60}})
        started = time.monotonic()
        await chat(client, "a-0", APPS)
        # the attack: one verdict, then the same request under 99 new source names
        codes = []
        for i in range(100):
            body = {"request_id": "a-0", "outcome": "failure", "source": f"bot{i}"}
            codes.append((await client.post(FEEDBACK, json=body, headers=APPS)).status_code)
        assert codes[0] == 200 and set(codes[1:60]) == {409} and set(codes[60:]) == {429}
        limited = await client.post(
            FEEDBACK, json={"request_id": "a-0", "outcome": "failure", "source": "qa"}, headers=APPS
        )
        assert limited.status_code == 429 and limited.json()["error"]["code"] == "feedback_rate_limited"
        assert int(limited.headers["retry-after"]) >= 1
        monotonic.advance(60)  # a minute later: tokens again, and one verdict per kind on a request
        kinds = [
            (await client.post(FEEDBACK, json={"request_id": "a-0", "outcome": "failure", "source": s}, headers=APPS))
            for s in ("user-thumbs", "user.web", "qa-batch", "business:crm", "other-thing")
        ]
        assert [r.status_code for r in kinds] == [200, 409, 200, 200, 409]
        assert "kind 'user'" in kinds[1].json()["error"]["message"]
        # apps' own verdicts: 4 failures on its request, its next request is routed by them ...
        await chat(client, "a-1", APPS)
        await chat(client, "o-1", OTHER)
        assert quality_used(await record(client, "a-1", APPS)) < quality_used(await record(client, "o-1", OTHER))
        # ... the other tenant's by the configured quality, exactly as before any feedback
        book = learning.quality
        assert book is not None
        shared, apps = book.estimate(LOCAL, BUCKET), book.estimate(LOCAL, BUCKET, "apps")
        assert book.estimate(LOCAL, BUCKET, "other") == shared == book.view()["targets"][LOCAL][BUCKET]["prior"]
        assert apps is not None and shared is not None and apps < shared
        assert time.monotonic() - started < BOUND_S

    asyncio.run(go())


def test_feedback_steers_only_its_tenant_typing_and_an_admin_moves_everyone() -> None:
    async def go() -> None:
        typing = {"enabled": True, "examples": EXAMPLES}
        client, learning, _ = build({"typing": typing, "feedback": {"per_tenant_per_minute": 1000}})
        await chat(client, "o-0", OTHER, MEDICAL)
        assert (await record(client, "o-0", OTHER))["contract"]["typing"]["scenario"] == "private"
        for i in range(40):  # apps teaches "medical is extraction" (an L1 scenario that may leave the cluster)
            await chat(client, f"a-{i}", APPS, f"patient medical diagnosis treatment history {i}")
            body = {"request_id": f"a-{i}", "outcome": "success", "source": "user", "label": "extraction"}
            reply = await client.post(FEEDBACK, json=body, headers=APPS)
            assert reply.status_code == 200 and reply.json()["applied"]["typing"] and reply.json()["scope"] == "own"
        await chat(client, "a-x", APPS, MEDICAL)
        await chat(client, "o-1", OTHER, MEDICAL)
        assert (await record(client, "a-x", APPS))["contract"]["typing"]["scenario"] == "extraction"  # its own
        theirs = (await record(client, "o-1", OTHER))["contract"]
        assert theirs["typing"]["scenario"] == "private" and theirs["residency"] == "local_only"
        assert learning.typer is not None and learning.typer.classifier is not None
        assert learning.typer.classifier.examples("private") == 2  # the configured examples are all kept
        # an admin's verdict moves every tenant's routing, weighted (learning.quality.max_feedback_per_tenant)
        await chat(client, "ops-0", OPS)
        body = {"request_id": "ops-0", "outcome": "failure", "source": "qa-review"}
        reply = await client.post(FEEDBACK, json=body, headers=OPS)
        assert reply.status_code == 200 and reply.json()["scope"] == "everyone"
        view = (await client.get("/v1/spillover/quality", headers=OPS)).json()
        stats = view["targets"][LOCAL]
        assert any(b["feedback_by_tenant"].get("ops", {}).get("moves") == "everyone" for b in stats.values())

    asyncio.run(go())


def test_shared_feedback_is_weighted_per_tenant() -> None:
    """Pure: a tenant whose feedback is shared still counts for at most max_feedback_per_tenant samples."""
    from router.learning.decision import Attempt, DecisionRecord
    from router.learning.quality import QualityBook

    contract = {"scenario": "default", "language": "latin", "est_prompt_tokens": 1, "needs_tools": False}
    rec = DecisionRecord(
        "r", "v", {**contract, "level": "L2"}, (), ((), ()), 0.0, chosen="t", attempts=(Attempt("t", "ok", 0.1),)
    )
    book = QualityBook({"t": 0.9}, min_samples=1, prior_strength=10, max_feedback_per_tenant=5)
    for _ in range(1000):
        book.feedback(rec, False, "loud", shared=True)
    book.feedback(rec, True, "quiet", shared=True)
    # 1000 failures count as 5: Beta(9, 1) + 1 success, 5 failures
    assert book.estimate("t", BUCKET) == (9 + 1) / (10 + 6)
