"""`spillover explain` renders a decision record readably."""

from __future__ import annotations

from cli.explain import render
from router.decision import Attempt, Candidate, DecisionRecord


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
