"""`spillover explain` renders a decision record readably."""

from __future__ import annotations

from router.learning.decision import Attempt, Candidate, DecisionRecord
from spillover.explain import render


def test_render_names_removals_scores_and_attempts() -> None:
    record = DecisionRecord(
        request_id="r-1",
        policy_version="local-1",
        contract={"model": "m", "scenario": "default", "level": "L1", "needs_tools": True, "residency": "any"},
        candidates=(
            Candidate("local:m", "removed", "tools", "no tool calling (set enable_auto_tool_choice)"),
            Candidate("cloud:sim/m", "ranked", scores={"quality": {"raw": 0.5, "score": 0.5, "weight": 1}}, total=0.5),
        ),
        tiers=((), ("cloud:sim/m",)),
        started_at=1.0,
        chosen="cloud:sim",
        attempts=(Attempt("cloud:sim/m", "ok", 0.25, 10, 5, 0.000004),),
    )
    text = render(record.to_dict())
    assert "policy version local-1" in text and "needs tools" in text
    assert "local:m" in text and "removed by tools: no tool calling" in text
    assert "ranked 0.500 (quality 0.50)" in text
    assert "chosen: cloud:sim" in text
    assert "attempt 1: cloud:sim/m -> ok in 0.250s, 10+5 tokens, $0.000004" in text


def test_render_says_when_a_stream_was_counted_and_what_the_contract_flagged() -> None:
    cut = Attempt("cloud:sim/m", "cut", 1.5, 40, 7, 0.00001, "provider_cut", usage="counted")
    flagged = Attempt("cloud:sim/m", "ok", 0.5, 10, 5, 0.000004, usage="reported", contract="schema: 2 errors")
    record = DecisionRecord("r-2", "local-1", {"model": "m"}, (), (), 1.0, attempts=(cut, flagged))
    text = render(DecisionRecord.from_json(record.to_json()).to_dict())
    assert "attempt 1: cloud:sim/m -> cut (provider_cut) in 1.500s, 40+7 tokens (counted from the stream)" in text
    assert "attempt 2: cloud:sim/m -> ok in 0.500s, 10+5 tokens, $0.000004, output contract: schema: 2 errors" in text


def test_render_escapes_terminal_controls_from_the_record() -> None:
    """Hostile input: a request id or reason a client chose cannot move the operator's cursor or recolour
    the terminal (ESC, CR, the C1 CSI, a bidirectional override are shown escaped)."""
    hostile = "r-\x1b[2J\rfake\x9b31m\u202e"
    removed = Candidate("local:m", "removed", "tools", "reason \x1b]0;owned\x07")
    record = DecisionRecord(hostile, "local-1", {"model": "m\x1b[31m"}, (removed,), (), 1.0)
    text = render(record.to_dict())
    assert not any(ch in text for ch in "\x1b\r\x9b\u202e\x07")
    assert "r-\\x1b[2J\\x0dfake\\x9b31m\\u202e" in text and "reason \\x1b]0;owned\\x07" in text
