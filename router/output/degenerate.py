"""A cheap check on live answers: did greedy decoding fall into a loop? Pure, linear in the answer.

A model computed with a wrong kernel or dtype does not say so: it answers fluently and then repeats
itself ("L'Étoile, la Marseillaise, la femme, la femme, la femme, …") until `max_tokens` cuts it. At
temperature 0 a loop never ends by itself, so the check looks only at greedy answers that ran into
their token limit (`finish_reason: length`) and asks whether their tail is one short phrase said
over and over:

    the last words are one n-gram (1 ≤ n ≤ MAX_N words) repeated at least MIN_REPEATS times in a
    row, and the repeated run covers at least MIN_SHARE of the answer's words (and MIN_WORDS words)

A hit is an output failure of the target that made it (it feeds health: serve_apps/) and a flag on
the answer's record; the answer itself is still the client's (a request may ask for repetition).
"""

from __future__ import annotations

import re

MAX_N = 8
MIN_REPEATS = 3
MIN_SHARE = 0.4
MIN_WORDS = 9
MAX_WORDS = 4096  # only the tail is read: bounded work whatever the answer's length
_WORD = re.compile(r"\w+|[^\w\s]")


def loop_in(text: str) -> str | None:
    """A description of the loop `text` ends in, or None."""
    words = _WORD.findall(text[-MAX_WORDS * 8 :])[-MAX_WORDS:]
    total = len(words)
    if total < MIN_WORDS:
        return None
    best: tuple[int, int] | None = None  # (n, repeats) covering the most words
    for n in range(1, MAX_N + 1):
        if n * MIN_REPEATS > total:
            break
        gram = words[-n:]
        repeats = 1
        while (repeats + 1) * n <= total and words[total - (repeats + 1) * n : total - repeats * n] == gram:
            repeats += 1
        if repeats >= MIN_REPEATS and (best is None or n * repeats > best[0] * best[1]):
            best = (n, repeats)
    if best is None:
        return None
    n, repeats = best
    covered = n * repeats
    if covered < MIN_WORDS or covered < MIN_SHARE * total:
        return None
    phrase = " ".join(words[-n:])[:60]
    return f"the answer ends in {phrase!r} repeated {repeats} times ({covered} of {total} words)"


def degenerate(text: str, *, temperature: float | None, finish_reason: str | None) -> str | None:
    """Why a greedy answer cut at its token limit is a loop (None: not greedy, not cut, or no loop)."""
    if temperature != 0 or finish_reason != "length":
        return None
    return loop_in(text)
