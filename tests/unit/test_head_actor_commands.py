"""An operator's command whose head-node actor is hung or gone: a 503 with code cluster_state_unavailable in
bounded time, never a 500 or a wait without end (serve_apps/head_actor.py `command_call`).

The fake actor reproduces what a hung Ray actor gives its caller: `.remote()` returns at once, and the object
it returns never resolves (a stopped process, an overloaded head node); a dead one raises Ray's own
RayActorError when awaited."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ray.exceptions import RayActorError

from router.error_codes import ErrorCode
from router.errors import TargetUnavailable
from serve_apps.head_actor import command_call
from serve_apps.traffic.board import RayBoard
from tests.unit.traffic_fixture import TrafficWorld, traffic_config


class _Method:
    def __init__(self, answer: Any) -> None:
        self._answer = answer

    def remote(self, *args: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if isinstance(self._answer, BaseException):
            future.set_exception(self._answer)
        elif self._answer is not None:
            future.set_result(self._answer)
        return future  # None: never resolved, as a hung actor's call


class FakeActor:
    def __init__(self, answer: Any = None) -> None:
        self.command = self.record = self.sync = _Method(answer)


async def test_a_hung_actor_is_a_503_naming_it_after_the_bound() -> None:
    with pytest.raises(TargetUnavailable) as caught:
        await command_call(FakeActor().command.remote(), "the traffic board", timeout_s=0.05)
    assert caught.value.status_code == 503 and caught.value.code == ErrorCode.CLUSTER_STATE_UNAVAILABLE
    assert "the traffic board" in caught.value.message and "within 0.05s" in caught.value.message


async def test_a_dead_actor_is_the_same_503_and_an_answer_passes_through() -> None:
    with pytest.raises(TargetUnavailable) as caught:
        await command_call(FakeActor(RayActorError()).command.remote(), "the breaker exchange")
    assert caught.value.code == ErrorCode.CLUSTER_STATE_UNAVAILABLE and "RayActorError" in caught.value.message
    assert await command_call(FakeActor(7).command.remote(), "the breaker exchange") == 7


async def test_a_traffic_command_against_a_hung_board_answers_503_over_http() -> None:
    world = TrafficWorld(traffic_config())
    http, _, _ = world.gateway(board=RayBoard(FakeActor(), command_timeout_s=0.05))  # type: ignore[arg-type]
    async with world.client(http) as client:
        answer = await client.post("/v1/spillover/traffic", json={"action": "drain", "target": "cloud:sim"})
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "cluster_state_unavailable"
    assert world.board.sync("x", [])[0]["drains"] == {}  # the world's own board never saw it
