"""A session kept on a smaller window is not re-summarised from scratch every turn: the summary of its
older turns is kept per session (router/sessions/summary_cache.py) and reused for the turns it covers, through
the real dispatcher over the shared fakes (tests/unit/test_session_dispatch.py's Parts: the local
FakeEngine writes the summaries, as the configured local summariser does)."""

from __future__ import annotations

from typing import Any

from router.sessions.carried import Label
from router.sessions.compress import SUMMARY_INTRO, plan_compression
from router.sessions.summary_cache import EARLIER, SummaryCache, incremental_transcript
from tests.unit.test_dispatch import World, stats
from tests.unit.test_session_dispatch import Parts, _long_turn, make_config

ANY = Label()  # summarised turns whose context may go anywhere (router/sessions/carried.py)


def _turns(n: int) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(n)]


def test_a_kept_summary_is_found_for_the_same_run_or_a_longer_one_starting_with_it() -> None:
    cache = SummaryCache(max_sessions=2)
    cache.keep("s1", "they plan Lisbon", "model:m", _turns(4), ANY)
    kept = cache.find("s1", _turns(4))
    assert kept is not None and (kept.text, kept.by, kept.count) == ("they plan Lisbon", "model:m", 4)
    assert cache.find("s1", _turns(6)) == kept  # the next turn's run starts with it
    assert cache.find("s1", _turns(3)) is None  # a shorter run: not what it covers
    edited = [*_turns(4), *_turns(2)]
    edited[1] = {"role": "assistant", "content": "an edited answer"}
    assert cache.find("s1", edited) is None  # the client changed an old turn: summarised again
    assert cache.find("s2", _turns(4)) is None  # another session's


def test_the_cache_is_bounded_least_recently_used_first() -> None:
    cache = SummaryCache(max_sessions=2)
    for key in ("a", "b"):
        cache.keep(key, key, "model:m", _turns(2), ANY)
    assert cache.find("a", _turns(2)) is not None  # a is now the most recent
    cache.keep("c", "c", "model:m", _turns(2), ANY)
    assert len(cache) == 2 and cache.find("b", _turns(2)) is None and cache.find("a", _turns(2)) is not None


def test_the_incremental_transcript_holds_the_kept_summary_and_only_the_newer_turns() -> None:
    messages = [{"role": "system", "content": "sys"}, *_turns(8)]
    plan = plan_compression(messages, 1, keep_last=2, summary_tokens=16)
    cache = SummaryCache()
    cache.keep("s", "they plan Lisbon", "model:m", messages[plan.start : plan.start + 4], ANY)
    kept = cache.find("s", messages[plan.start : plan.end])
    assert kept is not None
    text = incremental_transcript(kept, messages, plan, max_chars=6000)
    assert text.startswith(EARLIER + "they plan Lisbon") and "turn 4" in text and "turn 5" in text
    assert "turn 3" not in text and "turn 6" not in text  # neither the covered turns nor the kept last ones
    assert len(incremental_transcript(kept, messages, plan, max_chars=40)) <= 40


def _summary_calls(p: Parts) -> list[dict[str, Any]]:
    return [body for _, _, body, rid in p.local.calls if rid.endswith("-summary")]


async def test_a_later_turn_on_the_smaller_window_reuses_the_summary_of_the_turns_it_covers() -> None:
    world = World()
    p = Parts(world, make_config(window=900))
    for i in range(5):
        await p.turn(_long_turn(i), f"r{i}")
    world.replica = stats(kv=0.95)
    await p.turn("Summarise the plan", "r5")  # switched to the smaller window: summarised in full
    (first,) = _summary_calls(p)
    assert "Turn 0 about Lisbon" in first["messages"][1]["content"]
    world.replica = stats(kv=0.1)
    await p.turn("And the hotels?", "r6")  # kept there: only the turns that became older are summarised
    second = _summary_calls(p)[1]["messages"][1]["content"]
    assert second.startswith(EARLIER) and "Turn 0 about Lisbon" not in second
    compression = p.session("r6")["prepared"][0]["compression"]
    assert compression["summary_by"] == "model:m" and compression["summary_reused"] > 0
    assert len(second) < len(first["messages"][1]["content"])
    # the same turn sent again (a retry): the kept summary covers the whole run, the summariser is not asked
    p.history = p.history[:-2]
    await p.turn("And the hotels?", "r6-again")
    assert len(_summary_calls(p)) == 2
    compression = p.session("r6-again")["prepared"][0]["compression"]
    start, end = compression["summarised_messages"]
    assert compression["summary_reused"] == end - start
    sent = [m["content"] for m in p.cloud.bodies[-1]["messages"]]
    assert sent[1].startswith(SUMMARY_INTRO)


async def test_an_extractive_summary_is_not_kept() -> None:
    from router.errors import UpstreamError

    world = World()
    p = Parts(world, make_config(window=900))
    for i in range(5):
        await p.turn(_long_turn(i), f"r{i}")
    world.replica = stats(kv=0.95)
    p.local.fail = UpstreamError("engine gone", code="upstream_error")
    await p.turn("Summarise the plan", "r5")
    assert p.session("r5")["prepared"][0]["compression"]["summary_by"] == "extractive"
    p.local.fail = None
    world.replica = stats(kv=0.1)
    await p.turn("And the hotels?", "r6")
    calls = _summary_calls(p)
    assert "Turn 0 about Lisbon" in calls[-1]["messages"][1]["content"]  # summarised in full by the model
    assert "summary_reused" not in p.session("r6")["prepared"][0]["compression"]
