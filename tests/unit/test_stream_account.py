"""A stream counted as it passes (serve_apps/streams/account.py): the usage chunk kept or dropped,
deltas counted, and the outcome every way a stream can end."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from router.errors import ContractViolation, UpstreamError
from router.output.tool_calls import StreamedMessage
from router.request.contract import derive_contract
from router.routing.capabilities import local_target
from router.routing.policy import Policy
from serve_apps.backend import BackendReply
from serve_apps.off_loop.check_pool import CheckPool
from serve_apps.streams.account import DONE, StreamEnd, StreamVerdict, Tally, accounted, asking_usage, wants_usage
from serve_apps.streams.contract import held_until_checked
from tests.fakes import chunk_event, usage_event

USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}


def test_a_stream_asks_for_its_usage_upstream_and_other_bodies_are_left_alone() -> None:
    body = {"stream": True, "stream_options": {"other": 1}}
    assert asking_usage(body) == {"stream": True, "stream_options": {"other": 1, "include_usage": True}}
    assert body == {"stream": True, "stream_options": {"other": 1}}  # the client's body is not changed
    assert asking_usage({"stream": False}) == {"stream": False}  # vLLM refuses stream_options without a stream
    asked = {"stream": True, "stream_options": {"include_usage": True}}
    assert asking_usage(asked) is asked and wants_usage(asked)
    assert not wants_usage({"stream": True}) and not wants_usage({"stream_options": "x"})


def test_the_usage_chunk_is_read_and_dropped_only_when_the_client_did_not_ask() -> None:
    for drop in (True, False):
        tally = Tally(drop_usage=drop)
        assert tally.feed(chunk_event("m", "Hi")) == chunk_event("m", "Hi")
        kept = tally.feed(usage_event("m", USAGE))
        assert kept == ("" if drop else usage_event("m", USAGE))
        assert tally.feed(DONE) == "" and tally.done
        assert tally.tokens(99) == (12, 3, "reported")


def test_without_a_usage_chunk_the_deltas_are_counted_and_the_prompt_estimated() -> None:
    tally = Tally()
    for part in ("", "Par", "is"):
        tally.feed(chunk_event("m", part))
    assert tally.tokens(40) == (40, 2, "counted")  # the empty role delta carries no token


def test_several_events_in_one_text_are_each_accounted() -> None:
    tally = Tally(drop_usage=True)
    kept = tally.feed(chunk_event("m", "a") + usage_event("m", USAGE) + chunk_event("m", "b") + DONE)
    assert kept == chunk_event("m", "a") + chunk_event("m", "b")
    assert tally.done and tally.reported == (12, 3) and tally.counted == 2


def test_an_error_event_and_junk_are_passed_on_and_noted() -> None:
    tally = Tally()
    error = 'data: {"error": {"message": "engine died", "code": "internal"}}\n\n'
    assert tally.feed(": keep-alive\n\n") == ": keep-alive\n\n"
    assert tally.feed("data: not json\n\n") == "data: not json\n\n"
    assert tally.feed(error) == error and tally.error_event == "internal"
    bad = 'data: {"choices": [], "usage": {"prompt_tokens": -5, "completion_tokens": "x"}}\n\n'
    tally.feed(bad)
    assert tally.reported == (0, 0)  # hostile counts are never trusted


async def _events(events: list[str], fail: Exception | None = None) -> AsyncIterator[str]:
    for event in events:
        yield event
    if fail is not None:
        raise fail


async def _drain(stream: AsyncIterator[str]) -> list[str]:
    return [text async for text in stream]


def _run(events: list[str], fail: Exception | None = None, **kw: object) -> tuple[list[str], list[StreamEnd]]:
    ends: list[StreamEnd] = []
    stream = accounted(_events(events, fail), kw.pop("tally", Tally()), 20, ends.append, **kw)  # type: ignore[arg-type]
    return asyncio.run(_drain(stream)), ends


def _run_until_error(events: list[str], fail: Exception | None) -> tuple[list[str], list[StreamEnd]]:
    """What the client got before the stream raised UpstreamError (it must), and how it was booked."""
    ends: list[StreamEnd] = []

    async def main() -> list[str]:
        sent: list[str] = []
        with pytest.raises(UpstreamError):
            async for text in accounted(_events(events, fail), Tally(), 20, ends.append):
                sent.append(text)
        return sent

    return asyncio.run(main()), ends


def test_a_complete_stream_ends_ok_with_its_reported_tokens() -> None:
    sent, ends = _run([chunk_event("m", "Hi"), usage_event("m", USAGE), DONE], tally=Tally(drop_usage=True))
    assert sent == [chunk_event("m", "Hi"), DONE]
    assert ends == [StreamEnd("ok", 12, 3, "reported")]


def test_a_stream_cut_after_its_first_byte_is_cut_with_what_it_consumed() -> None:
    cut = UpstreamError("connection lost", code="provider_cut")
    sent, ends = _run_until_error([chunk_event("m", "Hi")], cut)
    assert sent == [chunk_event("m", "Hi")]
    assert [(e.outcome, e.prompt_tokens, e.completion_tokens, e.usage) for e in ends] == [("cut", 20, 1, "counted")]
    assert ends[0].error is cut


def test_an_error_event_then_done_is_a_cut_and_a_stream_without_done_too() -> None:
    error = 'data: {"error": {"message": "engine died", "code": "internal"}}\n\n'
    _, ends = _run([chunk_event("m", "Hi"), error, DONE])
    assert ends[0].outcome == "cut" and ends[0].error is not None and ends[0].error.code == "internal"
    with pytest.raises(UpstreamError, match="before \\[DONE\\]"):  # ambiguous: the clean error event follows
        _run([chunk_event("m", "Hi")])


def test_a_stream_without_done_is_booked_as_cut() -> None:
    sent, ends = _run_until_error([chunk_event("m", "Hi")], None)
    assert sent == [chunk_event("m", "Hi")]
    assert ends[0].outcome == "cut" and ends[0].error is not None and ends[0].error.code == "stream_cut"


def test_a_client_that_goes_away_is_cancelled_charged_what_was_sent_and_the_backend_closed() -> None:
    ends: list[StreamEnd] = []
    closed: list[bool] = []

    async def backend() -> AsyncIterator[str]:
        try:
            for i in range(100):
                yield chunk_event("m", f"t{i}")
        finally:
            closed.append(True)

    async def main() -> None:
        stream = accounted(backend(), Tally(), 20, ends.append)
        for _ in range(3):
            await stream.__anext__()
        await stream.aclose()  # what Starlette does when the client disconnects

    asyncio.run(main())
    assert [(e.outcome, e.completion_tokens, e.usage) for e in ends] == [("cancelled", 3, "counted")]
    assert closed == [True]


def _tool_stream(arguments: str) -> list[str]:
    call = {"index": 0, "id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    chunk = {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}
    return [f"data: {json.dumps(chunk)}\n\n", DONE]


def test_the_check_sees_the_assembled_answer_and_an_l2_flag_ends_ok() -> None:
    seen: list[dict[str, object]] = []

    async def flag(message: StreamedMessage) -> StreamVerdict:
        seen.append(message.message())
        return StreamVerdict(flagged="schema: 1 error", errors=("$.x: bad",))

    sent, ends = _run(_tool_stream('{"x": 1}'), check=flag)
    assert sent[-1] == DONE and seen[0]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'  # type: ignore[index]
    assert (ends[0].outcome, ends[0].contract, ends[0].contract_errors) == ("ok", "schema: 1 error", ("$.x: bad",))


def test_an_l1_violation_after_bytes_were_sent_raises_instead_of_done() -> None:
    violation = ContractViolation("broke it", errors=["$.x: bad"])

    async def fail(message: StreamedMessage) -> StreamVerdict:
        return StreamVerdict(errors=("$.x: bad",), violation=violation)

    ends: list[StreamEnd] = []

    async def main() -> list[str]:
        sent: list[str] = []
        with pytest.raises(ContractViolation):
            async for text in accounted(_events(_tool_stream("{}")), Tally(), 20, ends.append, fail):
                sent.append(text)
        return sent

    assert DONE not in asyncio.run(main())
    assert ends[0].outcome == "contract_violation" and ends[0].error is violation


def test_a_failing_finish_never_fails_the_stream() -> None:
    def broken(end: StreamEnd) -> None:
        raise RuntimeError("ledger on fire")

    stream = accounted(_events([chunk_event("m", "Hi"), DONE]), Tally(), 20, broken)
    assert asyncio.run(_drain(stream)) == [chunk_event("m", "Hi"), DONE]


def test_a_held_back_stream_left_by_its_client_closes_the_backend() -> None:
    closed: list[bool] = []

    async def backend() -> AsyncIterator[str]:
        try:
            for i in range(100):
                yield chunk_event("m", f"t{i}")
        finally:
            closed.append(True)

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [tool], "stream": True}
    contract = derive_contract(body, {"x-spillover-level": "L1"}, Policy())

    async def main() -> None:
        target = local_target("m", {"max_model_len": 4096})
        reply = await held_until_checked(BackendReply(chunks=backend()), contract, target, CheckPool())
        assert reply.chunks is not None
        assert await reply.chunks.__anext__() == chunk_event("m", "t0")  # held until the first content
        await reply.chunks.aclose()  # type: ignore[attr-defined]
        assert closed == [True]  # closed by then, not whenever the garbage collector gets to it

    asyncio.run(main())


def test_a_stream_that_must_call_a_tool_is_held_to_its_end_and_text_fails_over() -> None:
    """tool_choice "required": vLLM's hermes parser streams a call cut short by max_tokens as text
    (`<tool_call>` and a JSON start, as qwen2-tiny-random answers); nothing of it reaches the client, the
    attempt is a violation the walk moves on from."""
    text = ['<tool_call>\n{"name": "f", ', '"arguments": {"city"']

    async def backend() -> AsyncIterator[str]:
        for part in text:
            yield chunk_event("m", part)
        yield DONE

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [tool], "stream": True}
    contract = derive_contract({**body, "tool_choice": "required"}, {"x-spillover-level": "L1"}, Policy())

    async def main() -> None:
        target = local_target("m", {"max_model_len": 4096})
        with pytest.raises(ContractViolation) as caught:
            await held_until_checked(BackendReply(chunks=backend()), contract, target, CheckPool())
        assert any("the answer has none" in e for e in caught.value.errors)

    asyncio.run(main())
