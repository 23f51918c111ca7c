"""Load-proportional spill (router/routing/local_share.py): the share moves by measured local latency and
failures, window by window, requests are kept local in turn at that share, and the burst decision sends the
others to the cloud only where local has room and the request may burst."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from cluster.config.deployment import parse_config
from router.errors import ConfigError
from router.request.openai_request import Kind
from router.routing.local_share import LocalShare, LocalShareSettings, ShareDraw
from serve_apps.backend import BackendReply
from tests.fakes import FakeEngine, FakeProvider
from tests.unit.test_deadline_spill import decide_with
from tests.unit.test_dispatch import CHAT, World, dispatcher, make_config, run

SETTINGS = LocalShareSettings(enabled=True, latency_target_s=10, window_s=10, decrease=0.5, increase=0.1)


def test_turns_keep_the_share_exactly_without_chance() -> None:
    share = LocalShare(SETTINGS, now=0)
    share.share = 0.6
    turns = [share.draw(1).local for _ in range(100)]
    assert sum(turns) == 60
    assert turns[:5] == [False, True, False, True, True]  # credit 0.6, 1.2, 0.8, 1.4, 1.0


def test_a_slow_window_cuts_the_share_a_good_one_raises_it_and_an_empty_one_keeps_it() -> None:
    share = LocalShare(SETTINGS, now=0)
    for latency in (2, 3, 4, 5, 6, 7, 8, 9, 12, 14):  # p90 of ten = the 9th: 12 s > 10 s
        share.observe(1, latency)
    draw = share.draw(10)
    assert share.share == pytest.approx(0.5)
    assert draw.detail == "cut after 10 local answers: p90 12.0 s vs 10 s, 0% failed vs 5%"
    for _ in range(9):
        share.observe(11, 3)
    share.observe(12, None)  # one failure in ten: 10% > 5%
    share.draw(20)
    assert share.share == pytest.approx(0.25)
    share.observe(21, 3)
    share.draw(30)
    assert share.share == pytest.approx(0.35)
    share.draw(65)  # three windows without local answers
    assert share.share == pytest.approx(0.35)
    floor = LocalShare(SETTINGS.model_copy(update={"min_share": 0.3}), now=0)
    for t in range(0, 50, 10):
        floor.observe(t + 1, 60)
        floor.draw(t + 10)
    assert floor.share == pytest.approx(0.3)


def test_only_burstable_requests_with_room_follow_a_cloud_turn() -> None:
    cloud_turn = ShareDraw(local=False, share=0.4, detail="cut after 8 local answers")
    route, reason = decide_with(None, share=cloud_turn)
    assert route == "cloud"
    assert reason == "load-proportional spill: local share 0.40 (cut after 8 local answers); local has room, this " \
        "turn is the cloud's"  # fmt: skip
    assert decide_with(None, share=ShareDraw(local=True, share=0.4, detail=""))[0] == "local"
    assert decide_with(None, share=cloud_turn, local_only=True)[0] == "local"
    assert decide_with(None, share=cloud_turn, providers=())[0] == "local"
    assert decide_with(None, share=cloud_turn, inflight=4)[0] == "cloud"  # at the limit: the limit's rule


MODELS = [{"alias": "m", "source": "prepared:x", "family": "llama"}]


def test_the_setting_is_off_by_default_and_checked() -> None:
    assert not parse_config({"models": MODELS}, "t").admission.local_share.enabled
    raw = {"models": MODELS, "admission": {"local_share": {"enabled": True, "decrease": 0.8}}}
    share = parse_config(raw, "t").admission.local_share
    assert share.enabled and share.decrease == 0.8
    with pytest.raises(ConfigError, match=r"admission\.local_share\.decrease"):
        parse_config({"models": MODELS, "admission": {"local_share": {"decrease": 1.5}}}, "t")


class SlowEngine(FakeEngine):
    """A local engine whose answers take 20 s of the world's clock (past the 10 s target)."""

    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world

    async def call(self, alias: str, kind: Kind, body: dict[str, Any], request_id: str) -> BackendReply:
        self.world.now += 20
        return await super().call(alias, kind, body, request_id)


async def test_the_gateway_moves_the_share_by_its_own_local_calls() -> None:
    world = World()
    raw = make_config().model_dump(mode="json")
    raw["admission"]["local_share"] = {"enabled": True, "latency_target_s": 10, "window_s": 10, "decrease": 0.5}
    cloud = FakeProvider()
    d = dispatcher(world, parse_config(raw, "t"), local=SlowEngine(world), cloud=cloud)
    # share 1: the first two local, 20 s each; the second's end closes the window the first's answer fell in
    # (slow: cut to 0.5); the next turns alternate from there, and the fourth's slow answer cuts it to 0.25
    routes = [(await run(d, "chat", CHAT, f"s-{i}")).route for i in range(1, 7)]
    assert routes == ["local", "local", "cloud", "local", "cloud", "cloud"], routes
    assert cloud.calls == ["s-3", "s-5", "s-6"]
    assert d.admission.share("m", peek=True) is None  # a peek takes no turn


class SlowStream(FakeEngine):
    """A local stream whose first byte comes at once and whose last 20 s of the world's clock later."""

    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world

    async def call(self, alias: str, kind: Kind, body: dict[str, Any], request_id: str) -> BackendReply:
        reply = await super().call(alias, kind, body, request_id)
        assert reply.chunks is not None
        return BackendReply(chunks=self._late(reply.chunks))

    async def _late(self, chunks: AsyncIterator[str]) -> AsyncIterator[str]:
        first = True
        async for chunk in chunks:
            if not first:
                self.world.now += 10  # each later event 10 s on: its two later ones, 20 s
            first = False
            yield chunk


async def test_a_streams_latency_is_counted_to_its_last_byte() -> None:
    world = World()
    raw = make_config().model_dump(mode="json")
    raw["admission"]["local_share"] = {"enabled": True, "latency_target_s": 10, "window_s": 10, "decrease": 0.5}
    d = dispatcher(world, parse_config(raw, "t"), local=SlowStream(world))
    routes = []
    for i in range(4):
        done = await run(d, "chat", {**CHAT, "stream": True}, f"t-{i}")
        if done.reply.chunks is not None:
            _ = [c async for c in done.reply.chunks]
        routes.append(done.route)
    # the first two stream for 20 s each (a fast first byte): the second's end closes the slow window, share 0.5
    assert routes == ["local", "local", "cloud", "local"], routes
