"""serve_apps/runner.py `start_serve` and `serve_controller_env`: Ray's `serve.start` waits on the first HTTP
proxy it asked for and raises when the controller killed that proxy for being slow to start (Ray's 5 s ready
check, on a loaded 2-core node) — while the controller itself is up and starts another. The fake below raises
what Ray raises there (`ActorDiedError`, or `TimeoutError` after 60 s) on the first call only, as the real one
does once the controller exists."""

from __future__ import annotations

from typing import Any

import pytest
import ray

from cluster.config.deployment import load_config
from router.errors import ClusterError
from serve_apps import runner


def test_the_proxy_ready_check_is_30_s_unless_the_operator_set_it() -> None:
    assert runner.serve_controller_env({}) == {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30"}
    assert runner.serve_controller_env({"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "7"}) == {
        "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "7"
    }


@pytest.mark.parametrize("first", [ray.exceptions.ActorDiedError(), TimeoutError("HTTP proxies not available")])
def test_a_proxy_replaced_while_starting_joins_the_running_controller(
    monkeypatch: pytest.MonkeyPatch, first: BaseException
) -> None:
    calls: list[dict[str, Any]] = []

    def start(**kwargs: Any) -> None:
        calls.append(kwargs)
        if len(calls) == 1:
            raise first

    monkeypatch.setattr(runner.serve, "start", start)
    said: list[str] = []
    runner.start_serve(load_config("configs/local.yaml"), said.append)
    assert len(calls) == 2 and "replaced while starting" in said[0]


def test_serve_that_cannot_start_is_a_cluster_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def start(**kwargs: Any) -> None:
        raise TimeoutError("HTTP proxies not available after 60s.")

    monkeypatch.setattr(runner.serve, "start", start)
    with pytest.raises(ClusterError, match="Serve did not start"):
        runner.start_serve(load_config("configs/local.yaml"), lambda _: None)
