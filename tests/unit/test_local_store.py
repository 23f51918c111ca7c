"""`state.url: local`: `spillover serve` starts a loopback Redis of its own for the gateway replicas
(serve_apps/runner.py `local_store`), a real redis-server here.

Its address replaces `local` in the config the replicas get, its password travels only in the job's
environment (under `state.password_env`), its data lives beside the model cache so that what it keeps
(the spend ledger's sums) survives a restart, and a cluster of several machines is refused it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cluster.config.deployment import parse_config
from router.errors import ClusterError
from serve_apps.runner import local_store
from serve_apps.state.redis_store import RedisStore

pytestmark = pytest.mark.realtime

RAW = {
    "models": [{"alias": "m", "source": "prepared:x", "family": "llama"}],
    "gateway": {"replicas": 2},
    "state": {"url": "local"},
}


def test_local_starts_a_loopback_redis_whose_password_is_only_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPILLOVER_CACHE", str(tmp_path))
    said: list[str] = []
    config, server, env = local_store(parse_config(RAW, "t"), said.append)
    assert server is not None
    try:
        assert config.state.url == f"redis://127.0.0.1:{server.port}/0"
        assert env == {"SPILLOVER_STATE_PASSWORD": server.password}
        assert server.password not in config.model_dump_json() and server.password not in " ".join(said)
        assert (tmp_path / "state-redis" / "appendonlydir").is_dir()  # durable: the append-only file

        async def book() -> dict[str, float]:
            store = RedisStore(config.state.url or "", password=env["SPILLOVER_STATE_PASSWORD"])
            await store.add_amounts("spend", {"total": 2.5})
            try:
                return await store.amounts("spend")
            finally:
                await store.close()

        assert asyncio.run(book()) == {"total": 2.5}
    finally:
        server.stop()
    # started again on the same folder: what it kept is there
    config, again, env = local_store(parse_config(RAW, "t"), said.append)
    assert again is not None
    try:

        async def read() -> dict[str, float]:
            store = RedisStore(config.state.url or "", password=env["SPILLOVER_STATE_PASSWORD"])
            try:
                return await store.amounts("spend")
            finally:
                await store.close()

        assert asyncio.run(read()) == {"total": 2.5}
    finally:
        again.stop()


def test_local_is_refused_with_a_cluster_address() -> None:
    config = parse_config({**RAW, "cluster": {"address": "10.0.0.1:6379"}}, "t")
    with pytest.raises(ClusterError, match="redis://HEAD:6380/0"):
        local_store(config, print)


def test_other_configs_pass_unchanged() -> None:
    config = parse_config({**RAW, "state": {"url": "redis://10.0.0.1:6380/0"}}, "t")
    assert local_store(config, print) == (config, None, {})
