"""The live routing weight applied to one request's candidates (rule: router/routing/weight_split.py).

The first candidate keeps the share of new requests its weight in the request's scenario gives
(serve_apps/traffic/live_scores.py: the health score followed in bounded steps); the others go to the
next candidate, with the demoted one right behind it. `Traffic.arrange` calls this before a graded
switch arranges the order, so the switch's split still counts only the requests that reach its
primary; health shares, breakers and quotas gate each attempt afterwards as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.routing.capabilities import Target
from router.routing.weight_split import reordered, weigh
from serve_apps.traffic.live_scores import MAX_KEYS, LiveScores


class WeightRouting:
    def __init__(self, scores: LiveScores) -> None:
        self._scores = scores
        self._counts: dict[tuple[str, str], int] = {}  # (target id, scenario) -> requests weighed

    def arrange(self, scenario: str, candidates: Sequence[tuple[Target, str]]) -> tuple[list[tuple[Target, str]], str]:
        """The candidates, the first moved behind the second for its weight's share; a note."""
        out = list(candidates)
        if not out:
            return out, ""
        first = out[0][0]
        weight, score = self._scores.weight(first.id, scenario)
        alternative = out[1][0].id if len(out) > 1 else None
        key = (first.id, scenario)
        count = self._counts.get(key, 0)
        weighed = weigh(first.id, weight, score, count, alternative=alternative)
        if not weighed.weighed:
            return out, ""
        if key in self._counts or len(self._counts) < MAX_KEYS:
            self._counts[key] = count + 1
        if not weighed.moved:
            return out, weighed.note
        return reordered(out, weighed.note), weighed.note

    def reset(self) -> None:
        self._counts.clear()
