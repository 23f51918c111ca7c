"""The script a prompt is written in, a cheap stand-in for its language (a quality bucket's `lang`).

    script_of(texts) -> zh | ja | ko | cyrillic | arabic | latin | other | none

Reads at most `MAX_CHARS` characters of letters; the most frequent script wins, except that any kana
makes it ja and any hangul ko (Japanese and Korean text mixes in CJK ideographs). Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

MAX_CHARS = 2000


def _script(ch: str) -> str | None:
    code = ord(ch)
    if 0x3040 <= code <= 0x30FF:
        return "ja"
    if 0xAC00 <= code <= 0xD7AF or 0x1100 <= code <= 0x11FF:
        return "ko"
    if 0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF:
        return "zh"
    if 0x0400 <= code <= 0x04FF:
        return "cyrillic"
    if 0x0600 <= code <= 0x06FF:
        return "arabic"
    if ch.isascii():
        return "latin" if ch.isalpha() else None
    return "latin" if 0x00C0 <= code <= 0x024F else ("other" if ch.isalpha() else None)


# every ASCII character that is not a letter, deleted by str.translate: an ASCII text's latin letters counted in C
_ASCII_NON_LETTERS = str.maketrans("", "", "".join(chr(c) for c in range(128) if not chr(c).isalpha()))


def script_of(texts: Iterable[str]) -> str:
    counts: Counter[str] = Counter()
    seen = 0
    for text in texts:
        part = text[: MAX_CHARS - seen]
        if part.isascii():  # most prompts: only latin letters to count (the same as the loop below, ~50x faster)
            letters = len(part.translate(_ASCII_NON_LETTERS))
            if letters:
                counts["latin"] += letters
        else:
            for ch in part:
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
