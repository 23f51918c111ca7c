"""`script_of` (router/request/language.py) counts an all-ASCII text's letters with `str.translate` instead of a
loop over its characters: the answer must be the loop's for any texts, ties and the 2,000-character cap included."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from router.request.language import MAX_CHARS, _script, script_of


def by_each_character(texts: list[str]) -> str:
    """The loop over every character, as script_of read texts before its ASCII shortcut."""
    counts: Counter[str] = Counter()
    seen = 0
    for text in texts:
        for ch in text[: MAX_CHARS - seen]:
            script = _script(ch)
            if script is not None:
                counts[script] += 1
        seen += min(len(text), MAX_CHARS - seen)
        if seen >= MAX_CHARS:
            break
    if not counts:
        return "none"
    for marked in ("ja", "ko"):
        if counts[marked]:
            return marked
    return counts.most_common(1)[0][0]


ALPHABET = st.sampled_from("ab Z1.,!\t\n~éжд你好ひ한لا€")
TEXTS = st.lists(st.text(alphabet=ALPHABET, max_size=40) | st.text(max_size=40), max_size=6)


@settings(max_examples=400, deadline=None)
@given(TEXTS)
def test_script_of_answers_as_the_loop_over_every_character(texts: list[str]) -> None:
    assert script_of(texts) == by_each_character(texts)


def test_the_cap_and_ascii_texts_without_letters() -> None:
    long_latin = "x" * (MAX_CHARS - 5)
    for texts in (["123 ... !!!"], [long_latin, "привет мир"], [long_latin + "12345", "привет"], ["", "...", "жж"]):
        assert script_of(texts) == by_each_character(texts)
    assert script_of(["123 ... !!!", "привет"]) == "cyrillic"


def test_a_tie_goes_to_the_script_seen_first() -> None:
    for texts in (["ab", "жд"], ["жд", "ab"], ["a", "ж", "b", "д"]):
        assert script_of(texts) == by_each_character(texts)
