"""What a provider's rate-limit response headers say is left of its limits, read defensively.

Cloud providers report the state of the caller's account on every answer (429s included):

    OpenAI-compatible   x-ratelimit-remaining-requests, x-ratelimit-remaining-tokens (counts),
                        x-ratelimit-reset-requests, x-ratelimit-reset-tokens (durations: "1s", "6m0s",
                        "20ms", "1h2m3.5s", or plain seconds)
    Anthropic           anthropic-ratelimit-requests-remaining / -tokens-remaining /
                        -input-tokens-remaining / -output-tokens-remaining (counts), each with its
                        -reset as an RFC 3339 time

`read_rate_limits` turns them into a `RateLimitReading` that `router.limits.quota.ProviderQuota.observe`
applies to the provider's RPM / TPM window. For tokens the smallest remaining count of the token
axes reported is kept (with its reset): the gateway's estimate counts prompt and output together.

The headers are hostile input: a value that is not a plain non-negative integer (at most 15
digits), a duration or time that does not parse, or an overlong value is ignored; a reset is
clamped to 0..`max_reset_s`, so a broken provider cannot close its quota for longer than a
Retry-After could. Pure: the wall time comes in as `wall_now` (an RFC 3339 reset is a wall time).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

_COUNT = re.compile(r"^[0-9]{1,15}$")
_DURATION_PART = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,9})?)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_MAX_VALUE_CHARS = 64

OPENAI_REQUESTS = ("x-ratelimit-remaining-requests", "x-ratelimit-reset-requests")
OPENAI_TOKENS = ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")
ANTHROPIC_REQUESTS = ("anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset")
ANTHROPIC_TOKENS = tuple(
    (f"anthropic-ratelimit-{axis}-remaining", f"anthropic-ratelimit-{axis}-reset")
    for axis in ("tokens", "input-tokens", "output-tokens")
)


@dataclass(frozen=True)
class Remaining:
    """`count` left on one axis; `reset_s` seconds until the provider refills it (None: not said)."""

    count: int
    reset_s: float | None


@dataclass(frozen=True)
class RateLimitReading:
    requests: Remaining | None
    tokens: Remaining | None


def read_rate_limits(headers: Mapping[str, str], *, wall_now: float, max_reset_s: float) -> RateLimitReading | None:
    """The reading in `headers` (names in lower case, as httpx gives them), or None when they hold none."""
    requests = _axis(headers, *OPENAI_REQUESTS, wall_now, max_reset_s) or _axis(
        headers, *ANTHROPIC_REQUESTS, wall_now, max_reset_s
    )
    token_axes = [_axis(headers, *OPENAI_TOKENS, wall_now, max_reset_s)]
    token_axes += [_axis(headers, *names, wall_now, max_reset_s) for names in ANTHROPIC_TOKENS]
    present = [axis for axis in token_axes if axis is not None]
    tokens = min(present, key=lambda axis: axis.count) if present else None
    if requests is None and tokens is None:
        return None
    return RateLimitReading(requests, tokens)


def _axis(
    headers: Mapping[str, str], remaining_name: str, reset_name: str, wall_now: float, max_reset_s: float
) -> Remaining | None:
    count = parse_count(headers.get(remaining_name))
    if count is None:
        return None
    reset = parse_reset(headers.get(reset_name), wall_now=wall_now)
    return Remaining(count, None if reset is None else min(max(reset, 0.0), max_reset_s))


def parse_count(raw: str | None) -> int | None:
    if raw is None:
        return None
    text = raw.strip()
    return int(text) if _COUNT.fullmatch(text) else None


def parse_reset(raw: str | None, *, wall_now: float) -> float | None:
    """Seconds until a reset given as a duration ("6m0s", "20ms", "1.5") or an RFC 3339 time."""
    if raw is None:
        return None
    text = raw.strip()
    if not text or len(text) > _MAX_VALUE_CHARS:
        return None
    seconds = _duration_s(text)
    if seconds is not None:
        return seconds
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if at.tzinfo is None:
        return None
    delta = at.timestamp() - wall_now
    return delta if math.isfinite(delta) else None


def _duration_s(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        return value if math.isfinite(value) and value >= 0 else None
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)
