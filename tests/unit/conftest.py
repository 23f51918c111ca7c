"""Every test under tests/unit/ carries the `unit` marker, so scripts/test can run the niced unit tests
(`-m "not realtime"`) apart from the realtime ones (`-m realtime`, at normal priority): see the markers in
pyproject.toml.

`server`: one real redis-server per test module that asks for it (tests/redis_server.py), for the shared-store
tests that run against both homes; `either_store`: each test once on each home of the shared store, the
in-process MemoryStore and that Redis (emptied first)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import pytest

from serve_apps.state.local_redis import LocalRedis
from serve_apps.state.memory import MemoryStore
from serve_apps.state.redis_store import RedisStore
from serve_apps.state.store import SharedStore
from tests.redis_server import redis_or_fail


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedis]:
    redis = redis_or_fail(tmp_path_factory.mktemp("redis"))
    yield redis
    redis.stop()


@pytest.fixture(params=["memory", "redis"])
async def either_store(request: pytest.FixtureRequest, server: LocalRedis) -> AsyncIterator[SharedStore]:
    if request.param == "memory":
        yield MemoryStore(clock=time.monotonic)
        return
    redis = RedisStore(server.url, password=server.password)
    await redis._redis.flushdb()
    yield redis
    await redis.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith("tests/unit/"):
            item.add_marker(pytest.mark.unit)
