"""Learning pooled across gateway replicas (serve_apps/learning/pooled_evidence.py): each replica's quality book,
feedback, live scores and graded-switch gates see every replica's traffic, through one bounded log in the shared
store. Run against both homes of the log: the in-process MemoryStore and a real Redis server (a stream), since
with several replicas it is Redis that carries it. Entries planted in the log are hostile input: none applied.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import httpx
import pytest

from router.errors import StoreUnavailable, UpstreamError
from router.learning.decision import Attempt
from router.learning.quality import QualityBook
from router.routing.capabilities import Registry
from serve_apps.learning.evidence_events import FeedbackEvent, Vocabulary, outcome_event, quality_event
from serve_apps.learning.pooled_evidence import LOG_KEY, EvidencePool, EvidenceSinks, PoolSettings
from serve_apps.learning.state import FeedbackEvidence
from serve_apps.state.fallback import FallbackStore
from serve_apps.state.memory import MemoryStore
from serve_apps.state.store import SharedStore
from serve_apps.traffic.wiring import TrafficParts
from tests.unit.traffic_fixture import TrafficWorld, traffic_config

BUCKET = "task=default|lang=latin|len=short|tools=0|risk=L2"
VOCAB = Vocabulary(
    targets=frozenset({"local:m", "cloud:sim/m", "cloud:sim", "cloud:spare"}),
    scenarios=frozenset({"default", "chat", "digest"}),
    owners=frozenset({"", "acme"}),
)


class Switchable(MemoryStore):
    """A primary whose logs refuse, while `down`, as a Redis that does not answer (RedisStore raises
    StoreUnavailable)."""

    down = False

    async def log_append(self, key: str, values: Sequence[bytes], max_len: int) -> None:
        if self.down:
            raise StoreUnavailable("redis at redis://127.0.0.1:1/0 did not answer")
        await super().log_append(key, values, max_len)

    async def log_after(self, key: str, after: str | None, count: int) -> list[tuple[str, bytes]]:
        if self.down:
            raise StoreUnavailable("redis at redis://127.0.0.1:1/0 did not answer")
        return await super().log_after(key, after, count)


class Wall:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(either_store: SharedStore) -> SharedStore:  # tests/unit/conftest.py: once on each home
    return either_store


def _book() -> QualityBook:
    return QualityBook({"local:m": 0.9, "cloud:sim/m": 0.8}, min_samples=5)


def _pool(store: SharedStore, replica: str, book: QualityBook, wall: Wall, **settings: float) -> EvidencePool:
    def feedback(event: FeedbackEvent) -> None:
        book.feedback_on(event.target, event.bucket, event.success, event.owner, shared=event.shared)

    sinks = EvidenceSinks(quality=book.observe_attempts, feedback=feedback, outcome=None)
    return EvidencePool(store, replica, VOCAB, sinks, wall=wall, settings=PoolSettings(**settings))  # type: ignore[arg-type]


def _samples(book: QualityBook, target: str = "local:m") -> float:
    return float(book.view()["targets"].get(target, {}).get(BUCKET, {}).get("samples", 0))


async def test_each_replica_learns_from_the_others_requests_and_its_own_once(store: SharedStore) -> None:
    wall = Wall()
    books = {name: _book() for name in ("a", "b", "c")}
    pools = {name: _pool(store, name, book, wall) for name, book in books.items()}
    for i, name in enumerate("abc"):  # 10 requests on each replica: its own book at once, queued for the others
        for _ in range(10):
            books[name].observe_attempts(BUCKET, [("local:m", "ok", 0.1 * (i + 1))])
            pools[name]._queued(quality_event(name, BUCKET, [("local:m", "ok", 0.1 * (i + 1))]))
    for pool in pools.values():
        await pool.exchange()
    for pool in pools.values():  # a second round: what the later replicas sent reaches the earlier ones
        await pool.exchange()
    assert [_samples(book) for book in books.values()] == [30, 30, 30]
    assert books["a"].estimate("local:m", BUCKET) == books["c"].estimate("local:m", BUCKET)
    assert pools["a"].counts.skipped_own == 10 and pools["a"].counts.applied == 20


async def test_feedback_is_pooled_under_its_owner_and_its_sharing(store: SharedStore) -> None:
    wall = Wall()
    a, b = _book(), _book()
    pool_a, pool_b = _pool(store, "a", a, wall), _pool(store, "b", b, wall)
    for _ in range(6):
        pool_a.feedback(FeedbackEvidence("local:m", BUCKET, False, "acme", False))
    await pool_a.exchange()
    await pool_b.exchange()
    view = b.view()["targets"]["local:m"][BUCKET]["feedback_by_tenant"]
    assert view == {"acme": {"successes": 0, "failures": 6, "moves": "own"}}
    assert b.estimate("local:m", BUCKET, "acme") is not None and b.estimate("local:m", BUCKET) is None


async def test_a_replica_that_starts_reads_the_quality_evidence_but_not_stale_outcomes(store: SharedStore) -> None:
    wall = Wall()
    seen: list[tuple[str, str, int, int]] = []
    old = _pool(store, "old", _book(), wall)
    for _ in range(25):
        old._queued(quality_event("old", BUCKET, [("local:m", "ok", 0.2)]))
    old._queued(outcome_event("old", "m", "default", 100, wall(), [Attempt("local:m", "error", 1.0)]))
    await old.exchange()
    wall.now += 120  # past the live horizon: that failure is history, not health
    fresh_book = _book()
    sinks = EvidenceSinks(fresh_book.observe_attempts, None, lambda m, s, n, a: seen.append((m, s, n, len(a))))
    fresh = EvidencePool(store, "new", VOCAB, sinks, wall=wall, settings=PoolSettings(live_horizon_s=60))
    await fresh.exchange()
    assert _samples(fresh_book) == 25 and fresh_book.estimate("local:m", BUCKET) is not None
    assert seen == [] and fresh.counts.stale == 1
    old._queued(outcome_event("old", "m", "default", 100, wall(), [Attempt("local:m", "error", 1.0)]))
    await old.exchange()
    await fresh.exchange()
    assert seen == [("m", "default", 100, 1)]


async def test_the_log_stays_bounded_and_a_long_one_is_caught_up_over_several_periods(store: SharedStore) -> None:
    wall = Wall()
    writer = _pool(store, "w", _book(), wall, max_events=5000)
    for _ in range(4500):
        writer._queued(quality_event("w", BUCKET, [("local:m", "ok", 0.1)]))
    await writer.exchange()
    reader_book = _book()
    reader = _pool(store, "r", reader_book, wall)
    await reader.exchange()
    assert 4000 <= _samples(reader_book) < 4500  # one period applies at most MAX_READ_PER_ROUND
    await reader.exchange()
    assert _samples(reader_book) == 4500
    for _ in range(3):
        writer._queued(quality_event("w", BUCKET, [("local:m", "ok", 0.1)]))
        await writer.exchange()
    assert len(await store.log_after(LOG_KEY, None, 100_000)) <= 6000


HOSTILE: list[bytes] = [
    b"",
    b"not json",
    b"[]",
    b"null",
    b'{"r": "x"}',
    b'{"r": "x", "k": "q", "b": "' + BUCKET.encode() + b'", "a": [["local:evil", "ok", 0.1]]}',  # unknown target
    b'{"r": "x", "k": "q", "b": "task=default", "a": [["local:m", "ok", 0.1]]}',  # not a bucket key
    b'{"r": "x", "k": "q", "b": "' + BUCKET.encode() + b'", "a": [["local:m", "ok", NaN]]}',
    b'{"r": "x", "k": "q", "b": "' + BUCKET.encode() + b'", "a": [["local:m", "ok", -1]]}',
    b'{"r": "x", "k": "q", "b": "' + BUCKET.encode() + b'", "a": [["local:m", "won", 0.1]]}',
    b'{"r": "x", "k": "q", "b": "' + BUCKET.encode() + b'", "a": [["local:m", "ok", true]]}',
    json.dumps({"r": "x", "k": "q", "b": BUCKET, "a": [["local:m", "ok", 1]] * 17}).encode(),  # over MAX_ATTEMPTS
    b'{"r": "x", "k": "q", "b": "' + BUCKET.encode() + b'", "a": [[["local:m"], "ok", 0.1]]}',  # unhashable
    b'{"r": "x", "k": "f", "b": "' + BUCKET.encode() + b'", "t": "local:m", "ok": 1, "o": "", "sh": true}',
    b'{"r": "x", "k": "f", "b": "' + BUCKET.encode() + b'", "t": "local:m", "ok": true, "o": "mallory", "sh": true}',
    b'{"r": "x", "k": "o", "m": "m", "s": "' + b"z" * 300 + b'", "n": 1, "w": 1, "a": []}',  # unknown scenario
    b'{"r": "x", "k": "o", "m": "m", "s": "default", "n": 1e400, "w": 1, "a": []}',
    b'{"r": "x", "k": "o", "m": {}, "s": "default", "n": 1, "w": 1, "a": []}',
    b'{"r": "' + b"x" * 200 + b'", "k": "q", "b": "' + BUCKET.encode() + b'", "a": []}',
    b"[" * 100_000,  # deep nesting: over the size bound and past the parser's recursion
    json.dumps({"r": "x", "k": "q", "b": BUCKET, "a": [], "pad": "x" * 20_000}).encode(),
]


async def test_planted_entries_are_never_applied_and_never_stop_the_good_ones(store: SharedStore) -> None:
    wall = Wall()
    await store.log_append(LOG_KEY, HOSTILE, 1000)
    await store.log_append(LOG_KEY, [quality_event("w", BUCKET, [("local:m", "ok", 0.1)])], 1000)
    book = _book()
    seen: list[object] = []
    sinks = EvidenceSinks(book.observe_attempts, seen.append, lambda *a: seen.append(a))
    pool = EvidencePool(store, "r", VOCAB, sinks, wall=wall)
    await pool.exchange()  # bounded work: MAX_READ_PER_ROUND entries a round, each parsed under its byte bound
    kept = len(await store.log_after(LOG_KEY, None, 1000))
    assert pool.counts.rejected == kept - 1 and pool.counts.applied == 1
    assert seen == [] and list(book.view()["targets"]) == ["local:m"] and _samples(book) == 1


async def test_with_the_store_down_each_replica_learns_alone_and_reads_on_once_it_is_back() -> None:
    wall = Wall()
    primary = Switchable(clock=time.monotonic)
    store = FallbackStore(primary, MemoryStore(clock=time.monotonic))
    book_a, book_b = _book(), _book()
    a, b = _pool(store, "a", book_a, wall), _pool(store, "b", book_b, wall)
    a._queued(quality_event("a", BUCKET, [("local:m", "ok", 0.1)]))
    await a.exchange()
    await b.exchange()
    assert _samples(book_b) == 1
    primary.down = True
    a._queued(quality_event("a", BUCKET, [("local:m", "ok", 0.1)]))
    await a.exchange()  # no error: nobody would read it, so it is not kept
    await b.exchange()
    assert _samples(book_b) == 1 and not store.view().up
    primary.down = False
    assert await store.check()
    a._queued(quality_event("a", BUCKET, [("local:m", "ok", 0.1)]))
    await a.exchange()
    await b.exchange()
    assert _samples(book_b) == 2


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
SWITCH = {"action": "switch", "model": "m", "primary": "local:m", "standby": "cloud:sim", "step_s": 0}
SWITCH["min_requests"] = 1


def _pooled(world: TrafficWorld, store: SharedStore, parts: TrafficParts, replica: str) -> EvidencePool:
    sinks = EvidenceSinks(None, None, parts.traffic.observed_elsewhere)
    targets = Registry.from_config(world.config.models, world.config.cloud.providers).targets
    vocab = Vocabulary(frozenset(t.id for t in targets), frozenset(world.config.policy.scenarios), frozenset({""}))
    pool = EvidencePool(store, replica, vocab, sinks, wall=world.clock)
    parts.traffic.on_observed.append(pool.observed)
    return pool


@pytest.mark.parametrize("pooled", [True, False])
async def test_a_canarys_gates_on_one_replica_judge_the_standby_on_every_replicas_traffic(pooled: bool) -> None:
    """The standby fails only on replica a's requests; replica b, which sent it nothing, rolls back by its own
    gates once the pool brought it a's outcomes (before any board sync could tell it a rolled back)."""
    world = TrafficWorld(traffic_config(migration={"stagger_s": 0}))
    store = MemoryStore(clock=world.clock)
    http_a, parts_a, _ = world.gateway("replica-a")
    _, parts_b, _ = world.gateway("replica-b")
    pool_a, pool_b = _pooled(world, store, parts_a, "replica-a"), _pooled(world, store, parts_b, "replica-b")
    await parts_a.traffic.sync_once()
    await parts_b.traffic.sync_once()
    async with world.client(http_a) as a:
        assert (await a.post("/v1/spillover/traffic", json=SWITCH)).status_code == 200
        await parts_b.traffic.sync_once()
        assert parts_b.traffic.view()["migrations"]["m"]["adopted"] is True
        for _ in range(500):
            if parts_a.traffic.view()["migrations"]["m"]["share"] >= 0.25:
                break
            await a.post("/v1/chat/completions", json=CHAT)
        world.sim.script = [UpstreamError("sim broke")] * 3
        for _ in range(4):
            assert (await a.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert parts_a.traffic.view()["migrations"]["m"]["phase"] == "rolled_back"
    if pooled:
        await pool_a.exchange()
        await pool_b.exchange()
    phase_b = parts_b.traffic.view()["migrations"]["m"]["phase"]
    assert phase_b == ("rolled_back" if pooled else "running"), parts_b.traffic.view()["migrations"]["m"]


async def test_the_requests_of_the_pool_reach_a_real_gateway_http_surface_unchanged() -> None:
    """Pooling changes no answer: a replica with a pool answers as one without (its hooks only queue)."""
    world = TrafficWorld(traffic_config())
    http, parts, _ = world.gateway()
    _pooled(world, MemoryStore(clock=world.clock), parts, "r-a")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=http.app), base_url="http://gw") as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200 and response.headers["x-spillover-target"] == "local:m"


async def test_every_round_reports_its_totals_to_the_metrics() -> None:
    from serve_apps.telemetry.metrics import GatewayMetrics

    store, wall, metrics = MemoryStore(clock=time.monotonic), Wall(), GatewayMetrics()
    await store.log_append(LOG_KEY, [quality_event("other", BUCKET, [("local:m", "ok", 0.1)]), b"{not json"], 100)
    book = _book()
    sinks = EvidenceSinks(book.observe_attempts, None, None)
    pool = EvidencePool(store, "r", VOCAB, sinks, wall=wall, on_exchanged=lambda c: metrics.learning_pool(c.totals()))
    pool._queued(quality_event("r", BUCKET, [("local:m", "ok", 0.1)]))

    class Stop(Exception):
        pass

    rounds = 0

    async def sleep(_: float) -> None:
        nonlocal rounds
        rounds += 1
        if rounds == 2:
            raise Stop

    with pytest.raises(Stop):
        await pool.run(sleep)  # two rounds: the second sends and reads nothing new, and counts nothing twice
    page = metrics.render().decode()
    for kind, value in (("sent", 1), ("applied", 1), ("rejected", 1), ("stale", 0), ("dropped", 0)):
        assert f'spillover_learning_evidence_total{{kind="{kind}"}} {value:.1f}' in page
