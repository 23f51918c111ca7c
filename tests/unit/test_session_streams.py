"""A streamed turn of a session feeds the state anchor and the stored history when its stream ends, as a
non-streamed answer does, through the real dispatcher and the real stream accounting over the shared
fakes. FakeEngine streams like vLLM's OpenAI server (the answer in chunk events, then `[DONE]`) and,
with `fail_mid_stream`, dies after its first event as a replica that goes away mid-answer does."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from cluster.config.deployment import SpilloverConfig, parse_config
from router.learning.decision import Attempt
from router.output.tool_calls import StreamedMessage
from router.request.contract import derive_contract
from router.sessions.carried import Label
from router.sessions.session_id import pin_key
from serve_apps.backend import BackendReply
from serve_apps.clocks import Clocks
from serve_apps.dispatch.dispatcher import Dispatcher
from serve_apps.dispatch.interfaces import Dispatched
from serve_apps.dispatch.parts import DispatchParts
from serve_apps.sessions.history import HistoryClient, HistoryStore, local_history
from serve_apps.sessions.pins import PinClient, PinTable, local_pins
from serve_apps.sessions.turns import Sessions
from serve_apps.streams.account import StreamEnd
from tests.fakes import FakeEngine, FakeProvider, chunk_event
from tests.unit.test_dispatch import World

ANSWER = '{"intent": "book", "status": "found 3 trains", "noise": 1}'
KEY = pin_key(None, "m", "s1")
LABEL = Label().to_json()  # a turn's context that may go anywhere (router/sessions/carried.py)


def make_config() -> SpilloverConfig:
    model = {"alias": "m", "source": "prepared:x", "family": "llama", "engine_args": {"max_model_len": 4096}}
    return parse_config({"models": [model], "sessions": {"store": True}}, "test")


class Parts:
    def __init__(self) -> None:
        self.config = make_config()
        self.world = World()
        self.engine = FakeEngine(answer=ANSWER)
        self.table = PinTable()
        self.store = HistoryStore()
        self.sessions = Sessions(
            self.config,
            self.engine,
            PinClient(*local_pins(self.table), cache_s=0.0),
            HistoryClient(*local_history(self.store)),
        )
        self.d = Dispatcher(
            self.config,
            self.engine,
            {"sim": FakeProvider()},
            self.world.snapshot,
            clocks=Clocks.of(self.world.clock),
            parts=DispatchParts(sessions=self.sessions),
        )

    async def turn(self, text: str, rid: str, *, stream: bool) -> Dispatched:
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": text}], "stream": stream}
        contract = derive_contract(body, {"x-spillover-session": "s1"}, self.config.policy)
        done = await self.d.dispatch("chat", body, rid, contract=contract, deadline_s=2)
        if done.reply.chunks is not None:
            try:
                async for _ in done.reply.chunks:
                    pass
            except Exception:  # noqa: BLE001 -- a cut stream ends with its error, as the client sees it
                pass
        await asyncio.gather(*self.sessions.pending)
        return done


async def test_a_streamed_answer_updates_the_anchor_and_the_stored_history() -> None:
    p = Parts()
    await p.turn("Book the train to Porto for Anna", "r1", stream=True)
    record = p.table.get(KEY)
    assert record is not None and record["turns"] == 1  # the answer did not count a second turn
    assert record["anchor"]["state"] == {"intent": "book", "status": "found 3 trains"}
    assert "Anna" in record["anchor"]["entities"]
    assert p.store.get(KEY)[0] == [
        {"role": "user", "content": "Book the train to Porto for Anna"},
        {"role": "assistant", "content": ANSWER},
    ]
    await p.turn("And back on Sunday?", "r2", stream=False)  # the next turn gets the streamed answer
    sent = p.engine.calls[-1][2]["messages"]
    assert sent[1] == {"role": "assistant", "content": ANSWER} and len(sent) == 3


async def test_a_streamed_answer_is_stored_like_the_same_answer_not_streamed() -> None:
    streamed, whole = Parts(), Parts()
    await streamed.turn("Book the train to Porto for Anna", "r1", stream=True)
    await whole.turn("Book the train to Porto for Anna", "r1", stream=False)
    assert streamed.store.get(KEY) == whole.store.get(KEY)  # the messages and their label
    assert streamed.table.get(KEY)["anchor"] == whole.table.get(KEY)["anchor"]  # type: ignore[index]


async def test_a_stream_cut_mid_answer_leaves_the_anchor_and_history_without_it() -> None:
    p = Parts()
    p.engine.fail_mid_stream = ConnectionError("replica gone")
    await p.turn("Book the train to Porto for Anna", "r1", stream=True)
    record = p.table.get(KEY)
    assert record is not None and "state" not in record["anchor"]  # the client's turn only
    assert p.store.get(KEY)[0] == [{"role": "user", "content": "Book the train to Porto for Anna"}]


async def _closed_stream_turn(p: Parts) -> Any:
    body = {"model": "m", "messages": [{"role": "user", "content": "Plan it"}], "stream": True}
    contract = derive_contract(body, {"x-spillover-session": "s1"}, p.config.policy)
    turn = await p.sessions.open(contract, body, "r1")
    turn.planner(lambda c: p.d.plan(c, "chat"))()

    async def nothing() -> Any:
        yield ""

    done = Dispatched(BackendReply(chunks=nothing()), "local", "local:m", "", 0.0)
    await turn.close([Attempt("local:m", "streaming", 0.1)], done)
    return turn


def _message(text: str) -> StreamedMessage:
    message = StreamedMessage()
    message.feed(json.loads(chunk_event("m", text).removeprefix("data: ")))
    return message


async def test_a_flagged_or_unfinished_stream_is_never_a_source() -> None:
    p = Parts()
    turn = await _closed_stream_turn(p)
    turn.stream_ended(StreamEnd("ok", 5, 5, "reported", contract="tool arguments broke the schema"), _message(ANSWER))
    turn.stream_ended(StreamEnd("cancelled", 5, 2, "counted"), _message(ANSWER))
    overflowed = _message(ANSWER)
    overflowed.overflowed = "more than 100000 characters"
    turn.stream_ended(StreamEnd("ok", 5, 5, "reported"), overflowed)
    assert not p.sessions.pending
    assert "state" not in p.table.get(KEY)["anchor"]  # type: ignore[index]
    turn.stream_ended(StreamEnd("ok", 5, 5, "reported"), _message(ANSWER))
    await asyncio.gather(*p.sessions.pending)
    assert p.table.get(KEY)["anchor"]["state"]["intent"] == "book"  # type: ignore[index]


def test_set_anchor_only_while_the_session_is_on_that_target_and_counts_no_turn() -> None:
    table = PinTable()
    assert not table.set_anchor("k", "local:m", {"task": "x"}, LABEL)  # no pin: nothing stored
    table.record("k", None, "local:m", {"task": "x"}, LABEL)
    assert table.set_anchor("k", "local:m", {"task": "x", "state": {"step": 2}}, LABEL)
    assert table.get("k")["anchor"]["state"] == {"step": 2} and table.get("k")["turns"] == 1  # type: ignore[index]
    table.record("k", "local:m", "cloud:sim/m", None, LABEL)  # moved meanwhile
    assert not table.set_anchor("k", "local:m", {"task": "late"}, LABEL)
    assert table.get("k")["anchor"]["state"] == {"step": 2}  # type: ignore[index]


async def test_a_pin_table_that_does_not_answer_loses_the_anchor_not_the_turn() -> None:
    async def broken(*args: Any) -> Any:
        raise ConnectionError("gone")

    table = PinTable()
    get, put, _ = local_pins(table)
    client = PinClient(get, put, broken, cache_s=1.0)
    await client.record("k", None, "local:m", {}, LABEL)
    assert not await client.set_anchor("k", "local:m", {"task": "x"}, LABEL) and client.failures == 1
    assert not await PinClient(get, put, cache_s=0.0).set_anchor("k", "local:m", {"task": "x"}, LABEL)  # no setter
