"""The shared store's contract, run against both homes: the in-process MemoryStore (its clock a manual one)
and a real Redis server (serve_apps/state/redis_store.py, the server's own clock: real short waits).

Each test is what a piece of cross-replica state relies on: a value set-if-absent once, windows that refuse
past their limit and roll over, leases that refuse past their limit and expire when their holder stops
renewing (a gateway that died), durable sums. Real Redis runs at normal priority (`realtime`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from serve_apps.state.local_redis import LocalRedis
from serve_apps.state.memory import MemoryStore
from serve_apps.state.redis_store import RedisStore, redacted
from serve_apps.state.store import SharedStore

pytestmark = pytest.mark.realtime


@dataclass
class Home:
    store: SharedStore
    wait: Callable[[float], Awaitable[None]]  # let this much time pass on the store's clock


class ManualClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
async def home(request: pytest.FixtureRequest, server: LocalRedis) -> AsyncIterator[Home]:
    if request.param == "memory":
        clock = ManualClock()

        async def advance(seconds: float) -> None:
            clock.now += seconds

        yield Home(MemoryStore(clock=clock, max_value_bytes=1024), advance)
        return
    store = RedisStore(server.url, password=server.password, max_value_bytes=1024)
    await store._redis.flushdb()
    yield Home(store, asyncio.sleep)
    await store.close()


async def test_put_if_absent_stores_once_and_answers_the_first_value(home: Home) -> None:
    store = home.store
    assert await store.put_if_absent("k", b"first", 5) is None
    assert await store.put_if_absent("k", b"second", 5) == b"first"
    assert await store.get("k") == b"first"


async def test_concurrent_put_if_absent_has_exactly_one_winner(home: Home) -> None:
    answers = await asyncio.gather(*(home.store.put_if_absent("race", str(i).encode(), 5) for i in range(20)))
    assert answers.count(None) == 1


async def test_values_expire_after_their_ttl(home: Home) -> None:
    await home.store.put("v", b"x", 0.2)
    assert await home.store.get("v") == b"x"
    await home.wait(0.35)
    assert await home.store.get("v") is None
    assert await home.store.put_if_absent("v", b"y", 5) is None


async def test_a_value_over_the_bound_is_not_stored(home: Home) -> None:
    assert await home.store.put("big", b"x" * 2048, 5) is False
    assert await home.store.get("big") is None
    with pytest.raises(ValueError):
        await home.store.put_if_absent("big", b"x" * 2048, 5)


async def test_delete_if_value_removes_only_its_own(home: Home) -> None:
    await home.store.put("marker", b"mine", 5)
    assert await home.store.delete("marker", if_value=b"theirs") is False
    assert await home.store.get("marker") == b"mine"
    assert await home.store.delete("marker", if_value=b"mine") is True
    assert await home.store.get("marker") is None
    assert await home.store.delete("marker") is False


async def test_a_window_refuses_past_its_limit_and_rolls_over(home: Home) -> None:
    store = home.store
    # windows are 0.5 s of the store's own clock (Redis TIME): three calls can straddle a boundary on a busy
    # machine, and then the second is rightly allowed in a fresh window; such a try is made again on a new key
    for attempt in range(5):
        key = f"rpm-{attempt}"
        first = await store.window_add(key, 2, 3, 0.5)
        refused = await store.window_add(key, 2, 3, 0.5)
        third = await store.window_add(key, 1, 3, 0.5)
        if first.window == refused.window == third.window:
            break
    assert first.allowed and first.used == 2
    assert not refused.allowed and refused.used == 2 and 0 < refused.retry_in_s <= 0.5
    assert third.allowed
    await home.wait(refused.retry_in_s + 0.6)
    assert (await store.window_add(key, 3, 3, 0.5)).allowed


async def test_concurrent_window_adds_never_pass_the_limit(home: Home) -> None:
    counts = await asyncio.gather(*(home.store.window_add("burst", 1, 5, 30) for _ in range(40)))
    assert sum(c.allowed for c in counts) == 5


async def test_window_adjust_gives_back_within_its_window(home: Home) -> None:
    store = home.store
    taken = await store.window_add("tpm", 900, 1000, 30)
    await store.window_adjust("tpm", taken.window, -800, 30)
    after = await store.window_add("tpm", 850, 1000, 30)
    assert after.allowed and after.used == pytest.approx(950)


async def test_leases_refuse_past_the_limit_and_a_release_frees_one(home: Home) -> None:
    store = home.store
    assert [await store.lease_take("m", f"r{i}", 2, 5) for i in range(3)] == [1, 2, None]
    assert await store.lease_take("m", "r0", 2, 5) == 2  # the holder's own lease: renewed, not a third
    await store.lease_drop("m", "r0")
    assert await store.lease_count("m") == 1
    assert await store.lease_take("m", "r2", 2, 5) == 2


async def test_concurrent_lease_takes_never_pass_the_limit(home: Home) -> None:
    taken = await asyncio.gather(*(home.store.lease_take("slots", f"h{i}", 4, 5) for i in range(24)))
    assert sum(t is not None for t in taken) == 4
    assert await home.store.lease_count("slots") == 4


async def test_leases_not_renewed_expire_and_renewed_ones_stay(home: Home) -> None:
    store = home.store
    await store.lease_take("m", "dead", 2, 0.3)  # its gateway died: nobody renews it
    await store.lease_take("m", "alive", 2, 0.3)
    await home.wait(0.2)
    await store.lease_renew("m", ["alive", "never-held"], 0.3)
    await home.wait(0.2)
    assert await store.lease_count("m") == 1
    assert await store.lease_holders("m") == ["alive"]
    assert await store.lease_take("m", "new", 2, 0.3) == 2
    assert sorted(await store.lease_holders("m")) == ["alive", "new"]
    assert len(await store.lease_holders("m", limit=1)) == 1
    await home.wait(0.4)
    assert await store.lease_count("m") == 0
    assert await store.lease_holders("m") == []


async def test_durable_sums_add_up(home: Home) -> None:
    await home.store.add_amounts("spend:2026-12", {"total": 1.25, "tenant:a": 1.25})
    await home.store.add_amounts("spend:2026-12", {"total": 0.5, "tenant:b": 0.5})
    assert await home.store.amounts("spend:2026-12") == pytest.approx(
        {"total": 1.75, "tenant:a": 1.25, "tenant:b": 0.5}
    )
    assert await home.store.amounts("spend:2027-01") == {}


async def test_a_log_reads_on_from_the_last_id_in_order(home: Home) -> None:
    store = home.store
    assert await store.log_after("ev", None, 10) == []
    await store.log_append("ev", [b"a", b"b"], 100)
    first = await store.log_after("ev", None, 10)
    assert [v for _, v in first] == [b"a", b"b"]
    await store.log_append("ev", [b"c"], 100)
    assert [v for _, v in await store.log_after("ev", first[-1][0], 10)] == [b"c"]
    assert [v for _, v in await store.log_after("ev", first[0][0], 1)] == [b"b"]  # count bounds one read
    assert await store.log_after("ev", (await store.log_after("ev", None, 10))[-1][0], 10) == []


async def test_a_log_keeps_about_its_last_max_len_entries_and_no_value_over_the_bound(home: Home) -> None:
    store = home.store
    for i in range(30):
        await store.log_append("cap", [str(i).encode() for i in range(i * 10, i * 10 + 10)], 20)
    kept = [v for _, v in await store.log_after("cap", None, 1000)]
    assert 20 <= len(kept) <= 200 and kept[-1] == b"299"  # Redis trims whole nodes (~): a few more may stay
    await store.log_append("big", [b"x" * 2048, b"ok"], 10)
    assert [v for _, v in await store.log_after("big", None, 10)] == [b"ok"]


async def test_a_log_read_after_an_id_not_its_own_starts_from_the_oldest(home: Home) -> None:
    await home.store.log_append("ev", [b"a"], 10)
    for foreign in ("junk", "", "-1", "9" * 40):
        assert [v for _, v in await home.store.log_after("ev", foreign, 10)] == [b"a"], foreign


def test_memory_store_evicts_the_values_closest_to_expiry_past_its_bytes() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock, max_bytes=100, max_value_bytes=100)

    async def fill() -> None:
        await store.put("soon", b"x" * 60, 1)
        await store.put("later", b"y" * 60, 100)  # 120 bytes: the one closest to expiry goes
        assert await store.get("soon") is None
        assert await store.get("later") == b"y" * 60
        await store.add_amounts("ledger", {"total": 1.0})  # no TTL: never evicted
        assert await store.amounts("ledger") == {"total": 1.0}

    asyncio.run(fill())


def test_a_url_password_never_shows_in_messages() -> None:
    assert redacted("redis://:s3cret@head:6379/0") == "redis://head:6379/0"
    assert redacted("redis://user:s3cret@head:6379/0") == "redis://user@head:6379/0"
    assert redacted("redis://head:6379/0") == "redis://head:6379/0"


async def test_a_wrong_password_is_store_unavailable_without_the_password(server: LocalRedis) -> None:
    from router.errors import StoreUnavailable

    store = RedisStore(server.url, password="not-the-password")
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        await store.get("k")
    assert "not-the-password" not in caught.value.message and server.password not in caught.value.message
    assert time.monotonic() - started < 5
    await store.close()


async def test_the_server_started_for_the_tests_refuses_clients_without_the_password(server: LocalRedis) -> None:
    from router.errors import StoreUnavailable

    store = RedisStore(server.url)
    with pytest.raises(StoreUnavailable):
        await store.ping()
    await store.close()
    assert Path(server.folder / "redis.conf").stat().st_mode & 0o077 == 0  # the password file: owner only
