"""Server-side history (router/sessions/history.py): what is put in front of a new turn, and how the store
is bounded."""

from __future__ import annotations

import json

from router.sessions.compress import message_tokens
from router.sessions.history import grown, resent_at, supply

SYSTEM = {"role": "system", "content": "be brief"}


def _stored(n: int) -> list[dict[str, str]]:
    out = []
    for i in range(n):
        out += [{"role": "user", "content": f"question {i} " * 10}, {"role": "assistant", "content": f"answer {i}"}]
    return out


def test_the_stored_history_goes_between_the_system_prompt_and_the_new_turn() -> None:
    new = {"role": "user", "content": "and now?"}
    result = supply(_stored(2), [SYSTEM, new], history_tokens=10_000)
    assert result.messages == [SYSTEM, *_stored(2), new]
    assert (result.supplied, result.dropped) == (4, 0)


def test_only_the_newest_that_fit_the_budget_are_supplied_and_the_rest_is_counted() -> None:
    stored = _stored(5)
    budget = sum(message_tokens(m) for m in stored[-4:])
    result = supply(stored, [{"role": "user", "content": "x"}], history_tokens=budget)
    assert result.messages[:-1] == stored[-4:] and result.dropped == 6 and result.tokens <= budget
    assert supply(stored, [], history_tokens=0).supplied == 0


def test_a_tool_result_is_never_supplied_without_its_call() -> None:
    stored = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "1", "content": "x" * 400},
        {"role": "assistant", "content": "done"},
    ]
    budget = message_tokens(stored[1]) + message_tokens(stored[2])  # the call itself does not fit
    result = supply(stored, [{"role": "user", "content": "next"}], history_tokens=budget)
    assert all(m.get("role") != "tool" for m in result.messages) and result.dropped == 2
    assert supply(stored, [], history_tokens=10_000).supplied == 3  # with its call it goes


def test_the_store_grows_by_the_new_turn_and_the_answer_and_stays_bounded() -> None:
    answer = {"role": "assistant", "content": "fine"}
    history = grown([], [SYSTEM, {"role": "user", "content": "hi"}], answer, max_bytes=10_000)
    assert history == [{"role": "user", "content": "hi"}, answer]  # the system prompt is the client's to send
    for i in range(200):
        history = grown(history, [{"role": "user", "content": f"turn {i} " * 20}], answer, max_bytes=2_000)
    assert len(json.dumps(history, separators=(",", ":")).encode()) <= 2_000
    assert history[-1] == answer and "turn 199" in history[-2]["content"]


def test_a_client_that_sends_the_whole_conversation_is_not_given_it_twice() -> None:
    new = {"role": "user", "content": "and now?"}
    result = supply(_stored(3), [SYSTEM, *_stored(3), new], history_tokens=10_000)
    assert result.messages == [SYSTEM, *_stored(3), new] and result.new == [new]
    assert (result.supplied, result.dropped, result.resent) == (0, 0, 6)


def test_a_store_cut_to_its_newest_turns_is_found_inside_the_whole_conversation() -> None:
    conversation = _stored(5)
    new = [{"role": "user", "content": "and now?"}]
    result = supply(conversation[-4:], [SYSTEM, *conversation, *new], history_tokens=10_000)
    assert result.messages == [SYSTEM, *conversation, *new] and result.new == new and result.resent == 4


def test_an_answer_stored_without_content_matches_the_clients_empty_copy() -> None:
    stored = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"id": "c1"}]}]
    sent = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}]
    assert supply(stored, [*sent, {"role": "tool", "tool_call_id": "c1", "content": "7"}], 10_000).resent == 2


def test_a_partial_or_altered_copy_is_not_taken_for_the_stored_history() -> None:
    stored = _stored(2)
    new = {"role": "user", "content": "and now?"}
    assert resent_at(stored, [*stored[:3], new]) is None  # the last stored answer is missing
    altered = [*stored[:3], {"role": "assistant", "content": "edited"}, new]
    result = supply(stored, altered, history_tokens=10_000)
    assert result.resent == 0 and result.supplied == 4 and result.new == altered


def test_finding_the_resent_history_is_linear_for_a_hostile_conversation() -> None:
    same = {"role": "user", "content": "a"}
    stored = [same] * 2000 + [{"role": "assistant", "content": "b"}]
    assert resent_at(stored, [same] * 20_000) is None  # a quadratic search would compare 40 million pairs
