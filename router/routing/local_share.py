"""Load-proportional spill: the share of a model's burstable requests kept local, moved by measured latency.

The approach of control layers that spill without a model of the engine: every `window_s` the share of new requests
sent to the local model is cut multiplicatively (× `decrease`) when the local answers of the last window were slow
(their p90 end-to-end latency, a stream's to its last byte, above `latency_target_s`) or failing (their error ratio
above `max_error_ratio`), and raised additively (+ `increase`, up to 1) otherwise; a window without local answers
leaves it as it is. Within the share, requests are kept local in turn, not by chance: each request adds the share to
a credit and goes local when the credit reaches 1 (then less 1), so any 100 consecutive requests at share 0.6 send
60 local.

It is a policy to compare against (`bench replay`), off by default (`admission.local_share`): it needs no fit, but
it learns only after the harm (a slow window has already been answered slowly) and settles by oscillating around the
share where latency crosses the target. It applies where local has room; a saturated model, a model at its admission
limit and `local_only` requests follow the other rules (router/routing/burst.py).

Pure: the caller passes the time; one instance per model, owned by one gateway replica.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import Field

from router.settings_base import StrictModel


class LocalShareSettings(StrictModel):
    """`admission.local_share`: the load-proportional spill (router/routing/local_share.py)."""

    enabled: bool = Field(False, description="spill a share of burstable requests by measured local latency")
    latency_target_s: float = Field(
        10.0,
        gt=0,
        description="a window whose local p90 end-to-end latency (a stream's to its last byte) passes this was slow",
    )
    max_error_ratio: float = Field(0.05, ge=0, le=1, description="a window whose local error ratio passes this failed")
    window_s: float = Field(10.0, gt=0, description="how often the share moves")
    decrease: float = Field(0.7, gt=0, lt=1, description="the share is multiplied by this after a slow window")
    increase: float = Field(0.05, gt=0, le=1, description="the share grows by this after a good window")
    min_share: float = Field(0.05, ge=0, le=1, description="the share never falls below this")


@dataclass(frozen=True)
class ShareDraw:
    """One request's turn: kept local or not, at which share, and why the share is what it is."""

    local: bool
    share: float
    detail: str

    def line(self) -> str:
        return f"load-proportional spill: local share {self.share:.2f} ({self.detail})"


class LocalShare:
    def __init__(self, settings: LocalShareSettings, now: float) -> None:
        self._settings = settings
        self.share = 1.0
        self._credit = 0.0
        self._window_start = now
        self._latencies: list[float] = []
        self._errors = 0
        self._why = "no window measured yet"

    def observe(self, now: float, latency_s: float | None) -> None:
        """A local attempt ended: answered after `latency_s`, or failed (None)."""
        self._roll(now)
        if latency_s is None:
            self._errors += 1
        else:
            self._latencies.append(latency_s)

    def draw(self, now: float) -> ShareDraw:
        """The next request's turn at the current share."""
        self._roll(now)
        self._credit += self.share
        local = self._credit >= 1.0 - 1e-9  # sums of a float share: 0.4 + 0.6 may fall short of 1
        if local:
            self._credit -= 1.0
        return ShareDraw(local, self.share, self._why)

    def _roll(self, now: float) -> None:
        s = self._settings
        if now - self._window_start < s.window_s:
            return
        answered = len(self._latencies)
        total = answered + self._errors
        if total:
            p90 = sorted(self._latencies)[max(0, math.ceil(0.9 * answered) - 1)] if answered else math.inf
            errors = self._errors / total
            if p90 > s.latency_target_s or errors > s.max_error_ratio:
                self.share = max(s.min_share, self.share * s.decrease)
                verdict = "cut"
            else:
                self.share = min(1.0, self.share + s.increase)
                verdict = "raised"
            shown = f"{p90:.1f} s" if answered else "none answered"
            self._why = (
                f"{verdict} after {total} local answers: p90 {shown} vs {s.latency_target_s:g} s, "
                f"{errors:.0%} failed vs {s.max_error_ratio:.0%}"
            )
        # several windows passed without traffic: only the last one counts, the share stays
        self._window_start = now - (now - self._window_start) % s.window_s
        self._latencies, self._errors = [], 0
