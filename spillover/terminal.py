"""Text from the gateway or its logs made safe for an operator's terminal."""

from __future__ import annotations

import unicodedata


def printable(text: str) -> str:
    """`text` safe for a terminal: control and format characters (ESC, CR, C1 controls such as CSI,
    bidirectional overrides) from the log are shown escaped (`\\x1b`), never sent raw."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(_escaped(c) if unicodedata.category(c) in ("Cc", "Cf") else c for c in text)


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
