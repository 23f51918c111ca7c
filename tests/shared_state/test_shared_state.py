"""N gateway replicas on M nodes decide as one: admission, records, idempotency, spend and metrics held in one
real Redis (docs/architecture.md "The shared store"), and a Redis that stops costs no request.

Each test's traffic goes through Serve's proxy, which picks a gateway replica per request (fewest queued
of two), so consecutive calls reach different replicas: a record read six times is read through more
than one of the three.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from ray.util.state import list_actors

from serve_apps.limits.shared_spend import month_key
from serve_apps.state.redis_store import RedisStore
from tests.shared_state.conftest import (
    ADMISSION_LIMIT,
    FRUGAL_BUDGET_USD,
    FRUGAL_KEY,
    GATEWAYS,
    MAIN_KEY,
    MODEL,
    NARROW_KEY,
    NARROW_MAX_CONCURRENT,
    Shared,
)

pytestmark = pytest.mark.integration
CLOUD = {"x-spillover-residency": "local-sim"}  # the cloud-sim's region, where the local model is not
ADMIN = {"authorization": f"Bearer {MAIN_KEY}"}


def store_status(shared: Shared) -> str:
    """What /readyz of the replica that answered says of the shared store."""
    status: str = httpx.get(f"{shared.base_url}/readyz", headers=ADMIN, timeout=10).json()["state"]["status"]
    return status


@dataclass(frozen=True)
class Answer:
    status_code: int
    headers: Mapping[str, str]
    body: dict[str, Any]

    def json(self) -> dict[str, Any]:
        return self.body


def chat(
    shared: Shared, text: str, *, max_tokens: int = 16, headers: dict[str, str] | None = None, key: str = MAIN_KEY
) -> Answer:
    """One chat through the gateway with the official `openai` client (a non-2xx raises its APIStatusError)."""
    client = openai.OpenAI(base_url=shared.openai_base, api_key=key, max_retries=0, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=max_tokens, extra_headers=headers
    )
    reply = raw.parse()
    return Answer(raw.status_code, raw.headers, reply.model_dump())


def test_three_gateway_replicas_run_on_two_nodes(shared: Shared) -> None:
    gateways = [
        a for a in list_actors(filters=[("state", "=", "ALIVE")], limit=1000) if "Gateway" in (a.class_name or "")
    ]
    assert len(gateways) == GATEWAYS, gateways
    assert len({a.node_id for a in gateways}) == 2, [a.node_id for a in gateways]
    ready = httpx.get(f"{shared.base_url}/readyz", headers=ADMIN, timeout=10).json()
    assert ready["state"]["status"] == "ok", ready


def engine_holds(shared: Shared) -> int:
    """What the model's replica itself holds: vLLM's running plus waiting requests, as its stats report."""
    view = httpx.get(f"{shared.openai_base}/spillover/cluster", headers=ADMIN, timeout=10).json()
    return max((r["num_running"] + r["num_waiting"] for r in view["replicas"] if r["model"] == MODEL), default=0)


def test_admission_holds_the_model_replicas_limit_across_every_gateway(shared: Shared) -> None:
    """24 concurrent long chats through 3 gateways: the engine never holds more than its limit of 4; the
    rest burst to the cloud (before the shared lease, each gateway admitted 4: 12)."""
    peak, stop = 0, threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, engine_holds(shared))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(lambda i: chat(shared, f"Tell me a long story number {i}.", max_tokens=96), range(24)))
    stop.set()
    watcher.join()
    assert [a.status_code for a in answers] == [200] * 24
    routes = [a.headers["x-spillover-route"] for a in answers]
    assert routes.count("cloud") >= 24 - 2 * ADMISSION_LIMIT, routes
    assert 0 < peak <= ADMISSION_LIMIT, peak


def test_every_decision_record_is_readable_through_every_gateway(shared: Shared) -> None:
    ids = [f"shared-record-{uuid.uuid4().hex[:12]}" for _ in range(8)]
    for request_id in ids:
        assert chat(shared, "Hi", headers={"x-request-id": request_id}).status_code == 200
    statuses = [
        httpx.get(f"{shared.openai_base}/spillover/decisions/{request_id}", headers=ADMIN, timeout=10).status_code
        for request_id in ids
        for _ in range(6)
    ]
    assert statuses == [200] * len(statuses), statuses


def quality_samples(shared: Shared) -> float:
    """Every answered attempt the quality book of the replica that answered has learnt from."""
    view = httpx.get(f"{shared.openai_base}/spillover/quality", headers=ADMIN, timeout=10).json()
    return float(sum(stats["samples"] for buckets in view["targets"].values() for stats in buckets.values()))


def test_every_gateway_learns_from_every_gateways_requests(shared: Shared) -> None:
    """30 answered chats spread over three gateways: each replica's quality book holds all 30, not its 10
    (the pooled evidence: serve_apps/learning/pooled_evidence.py). Read through the one address, 12 reads
    reach every replica; each must show the whole."""
    deadline = time.monotonic() + 30
    before = [quality_samples(shared) for _ in range(12)]
    while max(before) != min(before):  # earlier tests' evidence still on its way to some replica
        assert time.monotonic() < deadline, before
        time.sleep(1)
        before = [quality_samples(shared) for _ in range(12)]
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda i: chat(shared, f"Hi {i}", max_tokens=4, headers=CLOUD), range(30)))
    assert [a.status_code for a in answers] == [200] * 30
    deadline = time.monotonic() + 30
    while True:
        # at least the 30, and the same on every replica: an earlier test's answer that ends late on a loaded
        # machine adds its evidence too (seen: 31 and 32), to every replica alike
        after = [quality_samples(shared) - before[0] for _ in range(12)]
        if min(after) >= 30 and max(after) == min(after):
            return
        assert time.monotonic() < deadline, after  # without pooling: about 10 on each replica
        time.sleep(1)


def test_a_tenant_with_max_concurrent_2_has_at_most_2_in_flight_across_every_gateway(shared: Shared) -> None:
    """Eight long chats of the narrow tenant at once, through three gateways: two run, six are refused
    (before the shared lease, each gateway allowed two: six)."""

    def send(i: int) -> int | str:
        try:
            chat(shared, f"Tell me a long tale number {i}.", max_tokens=96, key=NARROW_KEY)
        except openai.RateLimitError as exc:
            return str(exc.code)
        return 200

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(send, range(8)))
    assert 1 <= outcomes.count(200) <= NARROW_MAX_CONCURRENT, outcomes
    assert all(o in (200, "tenant_concurrency_exceeded") for o in outcomes), outcomes


def test_a_tenant_past_its_monthly_budget_gets_402_from_every_gateway(shared: Shared) -> None:
    """The frugal tenant's cloud answers, one at a time through the three gateways, until one is refused 402
    `tenant_budget_exceeded`. Its spend is summed in the shared store: a gateway sees its own bookings at once and
    the others' at most 10 s old (serve_apps/limits/shared_spend.py, docs/http-api.md), so the refusal comes once
    the spend reached the budget and before the three together spent three budgets (each a few answers here).
    Then every gateway refuses: twelve calls of the direct port (a connection each, spread over the three) all get
    the 402."""
    cloud = {"x-spillover-residency": "local-sim"}
    outcomes: list[int | str] = []
    for i in range(60):
        try:
            chat(shared, f"frugal question {i}", max_tokens=8, headers=cloud, key=FRUGAL_KEY)
            outcomes.append(200)
        except openai.APIStatusError as exc:
            outcomes.append(str(exc.code))
            assert exc.status_code == 402, (exc.status_code, exc.message)
            break
    assert outcomes[-1] == "tenant_budget_exceeded" and outcomes.count(200) >= 2, outcomes
    eventually(lambda: ledger_tenant_total(shared, "frugal") >= FRUGAL_BUDGET_USD, 30, "the spend was not booked")
    spent = ledger_tenant_total(shared, "frugal")
    assert spent <= GATEWAYS * FRUGAL_BUDGET_USD * 1.2, (spent, outcomes)  # each gateway: its budget, one answer

    def every_gateway_refuses() -> bool:
        codes = []
        for i in range(12):
            response = httpx.post(
                f"{shared.direct_url}/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": f"more {i}"}], "max_tokens": 4},
                headers={"authorization": f"Bearer {FRUGAL_KEY}", **cloud},
                timeout=60,
            )
            codes.append(response.status_code)
        return codes == [402] * 12

    eventually(every_gateway_refuses, 30, "a gateway still served the tenant past its budget")


def ledger_tenant_total(shared: Shared, tenant: str) -> float:
    with sqlite3.connect(str(shared.ledger)) as db:
        (total,) = db.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM spend WHERE tenant = ?", (tenant,)).fetchone()
    return float(total)


def cloud_bodies_with(shared: Shared, marker: str) -> int:
    lines = shared.cloud_log.read_text().splitlines()
    return sum(marker in json.loads(line).get("body", "") for line in lines if line.strip())


def test_one_idempotency_key_sent_six_times_at_once_reaches_the_provider_once(shared: Shared) -> None:
    marker = f"idem-{uuid.uuid4().hex[:10]}"
    headers = {"idempotency-key": marker, **CLOUD}

    def send(_: int) -> Answer:
        return chat(shared, f"Repeat after me: {marker}", headers=headers)

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(send, range(6)))
    assert [a.status_code for a in answers] == [200] * 6
    assert len({a.json()["choices"][0]["message"]["content"] for a in answers}) == 1
    assert sum(a.headers.get("x-spillover-idempotent-replay") == "true" for a in answers) == 5
    assert cloud_bodies_with(shared, marker) == 1


def ledger_total(shared: Shared, since: float) -> float:
    with sqlite3.connect(shared.ledger) as conn:
        (total,) = conn.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM spend WHERE at >= ?", (since,)).fetchone()
    return float(total)


def store_total(shared: Shared) -> float:
    async def read() -> float:
        store = RedisStore(shared.redis.url, password=shared.redis.password)
        try:
            return (await store.amounts(month_key(time.time()))).get("total", 0.0)
        finally:
            await store.close()

    return asyncio.run(read())


def eventually(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def test_spend_booked_by_every_gateway_adds_up_in_one_monthly_total(shared: Shared) -> None:
    since, before = time.time(), store_total(shared)
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(lambda i: chat(shared, f"cloud {i}", headers={"x-spillover-residency": "local-sim"}), range(16))
        )
    assert all(a.status_code == 200 and a.headers["x-spillover-route"] == "cloud" for a in answers)
    eventually(lambda: ledger_total(shared, since) > 0, 30, "no spend in the ledger")
    eventually(
        lambda: abs((store_total(shared) - before) - ledger_total(shared, since)) < 1e-9,
        30,
        f"the store's month total moved {store_total(shared) - before} for {ledger_total(shared, since)} booked",
    )


def requests_total(shared: Shared) -> tuple[float, dict[str, float]]:
    """The requests every replica counted, summed, and each replica's `spillover_state_store_up` (a gauge
    every replica has: which replicas the scrape saw)."""
    text = httpx.get(f"{shared.base_url}/metrics", timeout=10).text
    total, replicas = 0.0, {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "spillover_requests_total":
                total += sample.value
            elif sample.name == "spillover_state_store_up":
                replicas[sample.labels.get("gateway_replica", "")] = sample.value
    return total, replicas


def test_a_scrape_of_the_one_address_sums_every_gateways_requests(shared: Shared) -> None:
    time.sleep(11)  # two push periods: every replica's last push is fresh
    before, _ = requests_total(shared)
    for i in range(30):
        assert chat(shared, f"count {i}", max_tokens=4).status_code == 200
    time.sleep(11)
    after, replicas = requests_total(shared)
    assert len(replicas) == GATEWAYS and set(replicas.values()) == {1.0}, replicas
    assert after - before == 30


def test_redis_stopped_costs_no_request_and_shared_state_resumes_when_it_is_back(shared: Shared) -> None:
    shared.redis.stop()
    try:
        answers = [chat(shared, f"while down {i}", max_tokens=4) for i in range(20)]
        assert [a.status_code for a in answers] == [200] * 20
        eventually(
            lambda: store_status(shared) != "ok",
            30,
            "/readyz never said the store is down",
        )
    finally:
        shared.redis.start()
    # every replica back on Redis: each pushes its series there again (a replica still down would not), so a
    # scrape shows all three with the store up, twice a push period apart
    for _ in range(2):
        eventually(
            lambda: (seen := requests_total(shared)[1]) == {r: 1.0 for r in seen} and len(seen) == GATEWAYS,
            60,
            f"the gateways did not all see the store back: {requests_total(shared)[1]}",
        )
        time.sleep(6)
    test_every_decision_record_is_readable_through_every_gateway(shared)
