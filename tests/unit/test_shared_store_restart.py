"""A Redis restart turns the fallback down once and up once (serve_apps/state/redis_store.py, fallback.py).

A restarted redis-server leaves the client pool's idle connections dead. On the real stack
(tests/shared_state) one of them failed ~14 s after the server was back ("Connection closed by server"),
turning the replica's store down again and sending that moment's writes to its own memory; the store now
drops its idle connections at the first connection error. Here (where redis-py's checkout check happens to
catch a dead one too): down once, up once, and what the append-only file kept reads back.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from serve_apps.state.fallback import FallbackStore
from serve_apps.state.memory import MemoryStore
from serve_apps.state.redis_store import RedisStore
from tests.redis_server import redis_or_fail

pytestmark = pytest.mark.realtime


async def test_after_a_restart_every_operation_reaches_the_server_again(tmp_path: Path) -> None:
    server = redis_or_fail(tmp_path / "redis")
    primary = RedisStore(server.url, password=server.password, timeout_s=0.5)
    store = FallbackStore(primary, MemoryStore(clock=time.monotonic))
    try:
        await asyncio.gather(*(store.put(f"k{i}", b"v", 60) for i in range(12)))  # a pool of idle connections
        server.stop()
        assert await store.get("k0") is None  # the replica's memory answers: down
        assert not store.view().up
        server.start()
        assert await store.check()
        for i in range(12):  # one at a time: each would take a stale connection from the pool
            assert await store.get(f"k{i}") == b"v", i  # the append-only file kept them
        assert store.view().up and store.view().outages == 1, store.view()
    finally:
        await primary.close()
        server.stop()
