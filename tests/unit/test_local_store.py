"""`state.url: local`: `spillover serve` starts a loopback Redis of its own for the gateway replicas
(serve_apps/runner.py `local_store`), a real redis-server here.

Its address replaces `local` in the config the replicas get, its password travels only in the job's
environment (under `state.password_env`), its data lives beside the model cache so that what it keeps
(the spend ledger's sums) survives a restart, and a cluster of several machines is refused it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from cluster.config.deployment import parse_config
from router.errors import ClusterError
from serve_apps.runner import local_store
from serve_apps.state import local_redis
from serve_apps.state.redis_store import RedisStore
from tests.redis_server import redis_or_fail

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


def test_stop_shuts_down_the_server_answering_there_and_keeps_its_data(tmp_path: Path) -> None:
    """The stop sequence's `--stop` (`ray down` leaves the head's Redis running): SHUTDOWN with the password
    file; the append-only file stays, and a second `--stop` finds nothing and succeeds."""
    server = redis_or_fail(tmp_path / "redis")
    secret = tmp_path / "password"
    secret.write_text(server.password + "\n")
    args = ["--host", server.host, "--port", str(server.port), "--password-file", str(secret), "--stop"]
    try:
        assert local_redis.main(args) == 0
        deadline = time.monotonic() + 10
        while server.answers():
            assert time.monotonic() < deadline, "still answering after --stop"
            time.sleep(0.05)
        assert list((tmp_path / "redis").glob("**/*.aof*")), "its append-only file is gone"
        assert local_redis.main(args) == 0  # nothing answers: already stopped
    finally:
        server.stop()


def test_start_without_a_folder_is_a_usage_error(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("p" * 32)
    with pytest.raises(SystemExit) as exited:
        local_redis.main(["--password-file", str(secret)])
    assert exited.value.code == 2
