"""Server-side history (router/history.py): what is put in front of a new turn, and how the store is bounded."""

from __future__ import annotations

import json

from router.compress import message_tokens
from router.history import grown, supply

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
