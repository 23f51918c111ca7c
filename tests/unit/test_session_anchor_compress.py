"""The state anchor (router/sessions/anchor.py) and compression planning
(router/sessions/compress.py): pure, no clock."""

from __future__ import annotations

import json

from router.sessions.anchor import ANCHOR_INTRO, AnchorRules, anchor_message, update_anchor, with_anchor
from router.sessions.compress import (
    SUMMARY_INTRO,
    compressed,
    extractive_summary,
    floor_tokens,
    message_tokens,
    plan_compression,
)

RULES = AnchorRules(fields=("intent", "status"), max_bytes=512, max_entities=4, task_chars=40)
CHAT = [
    {"role": "system", "content": "You book trips."},
    {"role": "user", "content": "Book a flight from Paris to Berlin on 12 May for 2 people, please."},
]


def test_the_anchor_keeps_the_task_the_configured_fields_and_recent_names() -> None:
    answer = json.dumps({"intent": "book_flight", "status": "awaiting payment", "price": 412, "secret": "x"})
    anchor = update_anchor(None, CHAT, answer, RULES)
    assert anchor["task"] == CHAT[1]["content"][:40]
    assert anchor["state"] == {"intent": "book_flight", "status": "awaiting payment"}  # only configured fields
    assert "Paris" in anchor["entities"] and "Berlin" in anchor["entities"]
    assert len(anchor["entities"]) <= 4


def test_a_later_turn_keeps_the_first_task_and_the_last_json_state() -> None:
    first = update_anchor(None, CHAT, json.dumps({"intent": "book_flight", "status": "searching"}), RULES)
    history = [*CHAT, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "Make it Munich instead"}]
    later = update_anchor(first, history, "Sure, not JSON this time", RULES)
    assert later["task"] == first["task"]
    assert later["state"] == first["state"]  # a plain-text answer keeps the last JSON state
    assert "Munich" in later["entities"]


def test_the_anchor_is_bounded_and_never_holds_the_history() -> None:
    huge = {"intent": "x" * 10_000, "status": {"nested": ["y" * 5000]}}
    rules = AnchorRules(fields=("intent", "status"), max_bytes=300, max_entities=50, task_chars=4000)
    history = [{"role": "user", "content": " ".join(f"Name{i}" for i in range(500))}]
    anchor = update_anchor(None, history, json.dumps(huge), rules)
    assert len(json.dumps(anchor, separators=(",", ":")).encode()) <= 300
    assert all(len(str(v)) <= 200 for v in anchor.get("state", {}).values())


def test_hostile_answers_do_not_break_the_anchor() -> None:
    for answer in ["[" * 100_000, "null", "[1, 2]", "{bad json", "", "\x00\x01"]:
        anchor = update_anchor(None, CHAT, answer, RULES)
        assert "state" not in anchor


def test_the_anchor_goes_after_the_clients_system_messages() -> None:
    anchor = {"task": "t"}
    out = with_anchor(CHAT, anchor)
    assert out[0] == CHAT[0] and out[2] == CHAT[1]
    assert out[1]["role"] == "user" and out[1]["content"].startswith(ANCHOR_INTRO)  # the client's text: never system
    assert json.loads(out[1]["content"].removeprefix(ANCHOR_INTRO)) == anchor
    assert anchor_message(anchor) == out[1]


def _history(turns: int, words: int = 60) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a careful assistant."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i}: " + "detail " * words})
        messages.append({"role": "assistant", "content": f"Answer {i}: " + "reply " * words})
    messages.append({"role": "user", "content": "And now the last question?"})
    return messages


def test_a_history_that_fits_is_left_alone() -> None:
    messages = _history(2)
    plan = plan_compression(messages, 10_000, keep_last=4, summary_tokens=64)
    assert not plan.needed and plan.fits and plan.saved == 0
    assert compressed(messages, plan, "unused", 64) == messages


def test_older_turns_are_summarised_keeping_the_system_prompt_and_the_last_turns() -> None:
    messages = _history(6)
    total = sum(message_tokens(m) for m in messages)
    plan = plan_compression(messages, total // 2, keep_last=3, summary_tokens=64)
    assert plan.needed and plan.fits and plan.tokens_before == total
    assert (plan.head, plan.start, plan.end) == (1, 1, len(messages) - 3)
    assert plan.saved == plan.tokens_before - plan.tokens_after > 0
    out = compressed(messages, plan, "they asked six questions", 64)
    assert out[0] == messages[0] and out[-3:] == messages[-3:]
    assert out[1] == {"role": "user", "content": SUMMARY_INTRO + "they asked six questions"}  # never system
    assert sum(message_tokens(m) for m in out) <= plan.tokens_after


def test_a_summary_longer_than_its_budget_is_clipped_so_the_estimate_holds() -> None:
    messages = _history(6)
    plan = plan_compression(messages, 500, keep_last=2, summary_tokens=32)
    out = compressed(messages, plan, "word " * 10_000, 32)
    assert sum(message_tokens(m) for m in out) <= plan.tokens_after <= 500


def test_a_tool_result_stays_with_the_call_that_asked_for_it() -> None:
    messages = [
        *_history(4),
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "1", "content": "42"},
    ]
    plan = plan_compression(messages, 200, keep_last=1, summary_tokens=32)
    assert messages[plan.end]["role"] == "assistant" and messages[plan.end + 1]["role"] == "tool"


def test_what_cannot_fit_says_so_and_is_not_shortened() -> None:
    messages = _history(6)
    plan = plan_compression(messages, 50, keep_last=4, summary_tokens=64)
    assert not plan.fits  # the caller refuses with 400, as without sessions
    only_new = [{"role": "user", "content": "word " * 1000}]
    alone = plan_compression(only_new, 10, keep_last=4, summary_tokens=64)
    assert not alone.needed and not alone.fits
    assert floor_tokens(messages, keep_last=4, summary_tokens=64) == plan.tokens_after


def test_the_extractive_summary_stays_within_its_budget() -> None:
    messages = _history(6)
    plan = plan_compression(messages, 300, keep_last=2, summary_tokens=40)
    text = extractive_summary(messages, plan, 40)
    assert 0 < len(text) <= 160 and "detail detail" in text and "Question" in text
