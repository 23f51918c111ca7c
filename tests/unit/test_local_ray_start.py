"""serve_apps/runner.py `connect_ray` without `cluster.address` starts a new local Ray whatever this machine
remembers. Ray's own address resolution (run for real below, not faked) makes a bare `ray.init()` attach to
the cluster named by RAY_ADDRESS or by the file that `ray start` and `ray.cluster_utils.Cluster` write
(ray_current_cluster in Ray's temp folder) — even one long gone — and then refuse the CPU count; only
`address="local"` ignores both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ray._private import services
from ray._private.utils import get_ray_address_file

from cluster.config.deployment import load_config
from serve_apps import runner


@pytest.fixture
def stale_ray_dir(tmp_path: Path) -> str:
    """A Ray temp folder whose address file names a cluster that no longer runs."""
    temp_dir = str(tmp_path)
    Path(get_ray_address_file(temp_dir)).write_text("192.0.2.2:33155")
    return temp_dir


def test_ray_attaches_a_bare_init_to_a_stale_address_file(stale_ray_dir: str) -> None:
    assert services.canonicalize_bootstrap_address(None, stale_ray_dir) == "192.0.2.2:33155"  # type: ignore[arg-type]  # Ray accepts None


def test_local_starts_a_new_ray_despite_the_file_and_ray_address(
    stale_ray_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "192.0.2.3:6379")
    assert services.canonicalize_bootstrap_address("local", stale_ray_dir) is None


def test_connect_ray_without_an_address_asks_for_a_new_local_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(runner.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(runner.ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setenv("RAY_ADDRESS", "192.0.2.3:6379")
    said: list[str] = []
    assert runner.connect_ray(load_config("configs/local.yaml"), said.append) is True
    assert calls[0]["address"] == "local"
    assert any("RAY_ADDRESS=192.0.2.3:6379 is not used" in line for line in said)
