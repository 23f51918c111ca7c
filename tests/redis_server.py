"""A real redis-server for the tests that need one (Debian's `redis-server`, which scripts/test installs).

`redis_or_fail()` starts a LocalRedis (serve_apps/state/local_redis.py) in a folder of its own: loopback,
a password, the append-only file on — as `spillover serve` starts it. Without redis-server on PATH the
test fails with the install hint (CI must never skip what it claims to test).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from serve_apps.state.local_redis import INSTALL_HINT, LocalRedis


def redis_or_fail(folder: Path) -> LocalRedis:
    if shutil.which("redis-server") is None:
        pytest.fail(f"redis-server is not installed: {INSTALL_HINT} (scripts/test installs it)")
    return LocalRedis(folder).start()
