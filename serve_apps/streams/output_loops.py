"""The live-answer loop check (router/output/degenerate.py) where the dispatcher meets a complete answer.

Greedy answers (temperature 0) of a local model with `models[].degenerate_check` that ran into their
token limit and end in a repeated phrase are flagged: the attempt's record names the loop among its
`contract_errors` (`degenerate_output: ...`), a complete answer's response carries `x-spillover-degraded:
degenerate_output` (a stream's headers left before its end: its record says it), and the model's health
hears an output failure instead of a success (enough of
them in a row turn it red, and traffic goes elsewhere until it recovers). The answer itself is still
returned: a client may have asked for repetition.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cluster.config.deployment import SpilloverConfig
from router.output.degenerate import degenerate
from router.routing.capabilities import Target

FLAG = "degenerate_output"


class LoopCheck:
    def __init__(self, config: SpilloverConfig) -> None:
        self._checked = {m.alias for m in config.models if m.degenerate_check}

    def for_stream(self, target: Target, sent: Mapping[str, Any]) -> Callable[[str, str | None], str | None] | None:
        """The check of a streamed answer, run when its stream ended whole (None: not checked)."""
        if target.kind != "local" or target.alias not in self._checked:
            return None
        temperature = _temperature(sent)
        return lambda text, finish_reason: degenerate(text, temperature=temperature, finish_reason=finish_reason)

    def loop(self, target: Target, sent: Mapping[str, Any], body: Mapping[str, Any] | None) -> str | None:
        """Why the complete answer `body` to `sent` is a loop (None: not checked, or no loop)."""
        if target.kind != "local" or target.alias not in self._checked or not body:
            return None
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            return None
        choice = choices[0]
        message = choice.get("message")
        text = message.get("content") if isinstance(message, Mapping) else choice.get("text")
        if not isinstance(text, str):
            return None
        return degenerate(text, temperature=_temperature(sent), finish_reason=choice.get("finish_reason"))


def _temperature(sent: Mapping[str, Any]) -> float | None:
    value = sent.get("temperature")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
