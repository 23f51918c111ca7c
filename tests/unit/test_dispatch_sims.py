"""The five cases of streams that finish, in the dispatcher with the real provider adapter
(OpenAICompatProvider) over three in-process cloud simulators a < b < c (httpx.ASGITransport), so
the faults are the simulator's wire faults and the tolerance is the adapter's own."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest

from bench.cloud_sim import SimSettings, build_app
from router.errors import RequestError
from router.request.contract import derive_contract
from router.routing.snapshot import ClusterSnapshot
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.providers import OpenAICompatProvider
from serve_apps.resilience.state import Resilience
from tests.fakes import FakeEngine
from tests.unit.test_dispatch_continuation import T0, Repairs, make_config

WORDS = "name the rivers and mountains of France please".split()
BODY = {"messages": [{"role": "user", "content": " ".join(WORDS)}], "stream": True, "max_tokens": 40}


class Sims:
    def __init__(self, **faults: dict[str, Any]) -> None:
        self.config = make_config()
        self.observer = Repairs()
        self.sims = {}
        providers = {}
        for provider in self.config.cloud.providers:
            settings = SimSettings(models=(f"{provider.name}-m",), ttft_s=0, tokens_per_s=0)
            settings = settings.merged(faults.get(provider.name, {}))
            sim = build_app(settings, rng=random.Random(1)).state.cloud_sim
            transport = httpx.ASGITransport(app=sim.app, raise_app_exceptions=False)
            providers[provider.name] = OpenAICompatProvider(provider, transport=transport, env={})
            self.sims[provider.name] = sim
        self.dispatcher = Dispatcher(
            self.config,
            FakeEngine(),
            providers,
            lambda: ClusterSnapshot(T0, (), 1.0),
            clocks=Clocks.of(lambda: T0),
            parts=DispatchParts(
                observer=self.observer, resilience=Resilience(self.config, clock=lambda: T0, rng=random.Random(1))
            ),
        )

    async def stream(self, request_id: str = "r1", scenario: str = "chat") -> list[dict[str, Any]]:
        contract = derive_contract({"model": "m", **BODY}, {"x-business-scenario": scenario}, self.config.policy)
        done = await self.dispatcher.dispatch("chat", BODY, request_id, contract=contract, deadline_s=30)
        assert done.reply.chunks is not None
        events = [e async for e in done.reply.chunks]
        assert events[-1] == "data: [DONE]\n\n"
        return [json.loads(e.removeprefix("data: ")) for e in events[:-1]]

    def record(self, request_id: str = "r1") -> Any:
        return self.dispatcher.decisions.get(request_id)


def words(chunks: list[dict[str, Any]]) -> list[str]:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]).split()


async def test_a_stream_cut_after_n_tokens_is_continued_into_one_answer() -> None:
    s = Sims(a={"midstream_cut_rate": 1.0, "cut_after_tokens": 4})
    chunks = await s.stream()
    assert words(chunks) == ["[cloud-sim:a-m]", *WORDS]  # a's first 4 tokens, then b's from the 5th
    assert chunks[-1]["spillover"]["splice_after_chunks"] == 4
    assert [(a.target, a.outcome) for a in s.record().attempts] == [("cloud:a/m", "cut"), ("cloud:b/m", "ok")]


async def test_the_same_cut_when_the_fallback_refuses_the_prefill() -> None:
    s = Sims(a={"midstream_cut_rate": 1.0, "cut_after_tokens": 4}, b={"accepts_prefill": False})
    chunks = await s.stream()
    assert words(chunks) == ["[cloud-sim:a-m]", *WORDS] and chunks[-1]["spillover"]["to"] == "cloud:c/m"
    assert [a.outcome for a in s.record().attempts] == ["cut", "error", "ok"]


async def test_and_the_clean_error_when_nobody_accepts_it() -> None:
    s = Sims(a={"midstream_cut_rate": 1.0}, b={"accepts_prefill": False}, c={"accepts_prefill": False})
    with pytest.raises(RequestError) as caught:
        await s.stream()
    assert caught.value.code == "provider_cut"
    assert [e["kind"] for e in s.record().events] == ["not_continued"]


@pytest.mark.parametrize(
    ("fault", "repair", "kind"),
    [("malformed_event_rate", "skipped_events", "skipped_event"), ("no_done_rate", "done_missing", "done_missing")],
)
async def test_a_malformed_event_or_a_missing_done_still_finishes(fault: str, repair: str, kind: str) -> None:
    s = Sims(a={fault: 1.0})
    chunks = await s.stream(scenario="default")  # tolerance needs no continuation
    assert words(chunks) == ["[cloud-sim:a-m]", *WORDS] and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert [a.target for a in s.record().attempts] == ["cloud:a/m"]
    assert s.record().events == ({"kind": "stream_repaired", "target": "cloud:a/m", repair: 1},)
    assert s.observer.repairs == [("cloud:a/m", kind)]


async def test_a_provider_too_small_for_the_prompt_fails_over_to_a_larger_window() -> None:
    s = Sims(a={"context_window": 20})
    chunks = await s.stream()
    assert words(chunks) == ["[cloud-sim:b-m]", *WORDS]
    assert [(a.target, a.error) for a in s.record().attempts] == [
        ("cloud:a/m", "context_length_exceeded"),
        ("cloud:b/m", None),
    ]
