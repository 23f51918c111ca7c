"""What `bench soak` measures, pure: windows of requests, growth of every process, the verdicts.

Records (times in seconds from the start of the soak):

    SoakRequest   one request: kind (stream | json | probe), share (mixed | cloud | probe), its
                  `RequestResult`, whether it was lost, and for a probe its answer and whether it was wrong
    ProcSample    one process at one sample: role (from its name / command line), pid, RSS, open FDs

A request is *lost* when the client got neither an answer nor an error it could act on: no response
at all (connection refused or reset, a timeout), a 200 whose body is not a complete answer, or a stream
that ended without `[DONE]` and without an error event. An HTTP error with a status, or a stream that
ends with an error event, is an *error*, not lost. A *wrong* answer is a probe (a fixed prompt at
temperature 0) whose text differs from the first probe's answer.

Windows are `window_s` long from the start; a request belongs to the window it ended in; the last
window is kept when at least half of it ran (what ends later, in the drain, counts in the last one, but
not in its latencies: the requests still in flight at the end are the long ones).
Window 0 is the warm-up: growth and the p99 are judged from window 1 (the "second window") to the last
one:

    growth          per process, the median of its samples in the last window against the second:
                    RSS and open FDs each grow less than `growth_limit` (5%), or by at most
                    `rss_slack_bytes` (8 MiB) / `fd_slack` (2) in absolute terms (a few descriptors or
                    pages of a small process are not a leak); a process of the stack that was there in
                    the second window and is gone in the last (crashed, replaced) fails it too
                    (`ray::IDLE` and task workers excepted: Ray starts and ends those at will)
    stable p99      the last window's e2e p99 (non-probe requests answered OK) ≤ `p99_ratio` (1.5) × the
                    second window's
    lost            0 over the whole run (warm-up included)
    wrong           0 over the whole run

A verdict with too little to judge (fewer than three windows, a window without an OK answer, no
process sampled in both windows) is not passed.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.load.request_result import RequestResult
from router.percentile import linear_percentile

LOST_CODES = frozenset({"stream_cut", "malformed", "timeout", "connect_error", "http_error", "no_answer"})
MIB = 1024 * 1024


def is_transient(role: str) -> bool:
    """A Ray worker that Ray starts and ends at will: `ray::IDLE`, or one titled after a task (lower case)."""
    return role == "ray::IDLE" or (role.startswith("ray::") and role[5:6].islower())


def is_lost(result: RequestResult) -> bool:
    """No answer and no error the client could act on (module docstring)."""
    if result.ok or result.cancelled:
        return False
    return result.status is None or result.error in LOST_CODES


@dataclass(frozen=True)
class SoakRequest:
    kind: str  # stream | json | probe
    share: str  # mixed (plain request: the gateway chooses) | cloud (pinned to the cloud region) | probe
    result: RequestResult
    answer: str | None = None  # a probe's text
    wrong: bool = False

    @property
    def lost(self) -> bool:
        return is_lost(self.result)

    def to_dict(self) -> dict[str, Any]:
        r = self.result
        return {
            "kind": self.kind,
            "share": self.share,
            "start_s": round(r.start_s, 3),
            "e2e_s": round(r.e2e_s, 4),
            "ttft_s": None if r.ttft_s is None else round(r.ttft_s, 4),
            "status": r.status,
            "error": r.error,
            "lost": self.lost,
            "route": r.route,
            "target": r.target,
            "output_tokens": r.output_tokens,
            "answer": self.answer,
            "wrong": self.wrong,
        }


@dataclass(frozen=True)
class ProcSample:
    t: float
    role: str
    pid: int
    rss_bytes: int
    fds: int

    @property
    def key(self) -> str:
        return f"{self.role} [{self.pid}]"


@dataclass(frozen=True)
class Window:
    index: int
    start_s: float
    end_s: float
    requests: int
    ok: int
    errors: int
    lost: int
    cancelled: int
    probes: int
    wrong: int
    cloud: int  # OK answers routed to the cloud
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    ttft_p50_s: float | None  # streams only
    ttft_p99_s: float | None
    error_codes: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def window_bounds(window_s: float, end_s: float) -> list[tuple[float, float]]:
    """[start, end) of each window; a last partial window is kept when at least half of it ran."""
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    bounds: list[tuple[float, float]] = []
    start = 0.0
    while start < end_s:
        stop = min(start + window_s, end_s)
        if stop - start >= window_s / 2 or not bounds:
            bounds.append((start, stop))
        start += window_s
    return bounds


def _index(t: float, bounds: Sequence[tuple[float, float]]) -> int | None:
    """The window `t` falls in; what ends after the last window (the drain, a dropped partial window)
    counts in the last one."""
    for i, (start, stop) in enumerate(bounds):
        if start <= t < stop:
            return i
    return len(bounds) - 1 if bounds and t >= bounds[-1][0] else None


def windows(requests: Sequence[SoakRequest], bounds: Sequence[tuple[float, float]]) -> list[Window]:
    grouped: list[list[SoakRequest]] = [[] for _ in bounds]
    for request in requests:
        i = _index(request.result.end_s, bounds)
        if i is not None:
            grouped[i].append(request)
    return [_window(i, b, group) for i, (b, group) in enumerate(zip(bounds, grouped, strict=True))]


def _window(index: int, bounds: tuple[float, float], group: Sequence[SoakRequest]) -> Window:
    load = [r for r in group if r.kind != "probe"]
    good = [r.result for r in load if r.result.ok]
    timed = [r for r in load if r.result.end_s <= bounds[1]]  # what ended in the drain counts, but is not timed
    e2e = [r.result.e2e_s for r in timed if r.result.ok]
    ttft = [t for r in timed if r.kind == "stream" and r.result.ok and (t := r.result.ttft_s) is not None]
    failed = [r for r in group if not r.result.ok and not r.result.cancelled]
    codes: dict[str, int] = {}
    for r in failed:
        codes[r.result.error or "?"] = codes.get(r.result.error or "?", 0) + 1
    probes = [r for r in group if r.kind == "probe"]
    return Window(
        index=index,
        start_s=bounds[0],
        end_s=bounds[1],
        requests=len(group),
        ok=sum(1 for r in group if r.result.ok),
        errors=len(failed),
        lost=sum(1 for r in group if r.lost),
        cancelled=sum(1 for r in group if r.result.cancelled),
        probes=len(probes),
        wrong=sum(1 for r in probes if r.wrong),
        cloud=sum(1 for r in good if (r.route or "").lower() == "cloud"),
        e2e_p50_s=linear_percentile(e2e, 50),
        e2e_p99_s=linear_percentile(e2e, 99),
        ttft_p50_s=linear_percentile(ttft, 50),
        ttft_p99_s=linear_percentile(ttft, 99),
        error_codes=codes,
    )


@dataclass(frozen=True)
class Growth:
    key: str
    role: str
    pid: int
    status: str  # measured | new (not there in the second window) | gone (not there in the last)
    rss_second: float | None = None
    rss_last: float | None = None
    fds_second: float | None = None
    fds_last: float | None = None
    passed: bool | None = None  # None: not judged (new, or a transient role that is gone)

    @property
    def rss_growth(self) -> float | None:
        return _relative(self.rss_second, self.rss_last)

    @property
    def fds_growth(self) -> float | None:
        return _relative(self.fds_second, self.fds_last)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rss_growth": self.rss_growth, "fds_growth": self.fds_growth}


def _relative(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before <= 0:
        return None
    return (after - before) / before


def _within(before: float, after: float, limit: float, slack: float) -> bool:
    return after - before <= slack or after < before * (1 + limit)


def growth(
    samples: Sequence[ProcSample],
    bounds: Sequence[tuple[float, float]],
    *,
    limit: float = 0.05,
    rss_slack_bytes: float = 8 * MIB,
    fd_slack: float = 2,
) -> list[Growth]:
    """Per process: second window's median against the last window's (module docstring)."""
    if len(bounds) < 3:
        return []
    second, last = bounds[1], bounds[-1]
    by_key: dict[str, list[ProcSample]] = {}
    for s in samples:
        by_key.setdefault(s.key, []).append(s)
    found = []
    for key, series in sorted(by_key.items()):
        early = [s for s in series if second[0] <= s.t < second[1]]
        late = [s for s in series if last[0] <= s.t <= last[1]]
        role, pid = series[0].role, series[0].pid
        if not early:
            found.append(Growth(key, role, pid, "new"))
            continue
        rss0, fds0 = statistics.median(s.rss_bytes for s in early), statistics.median(s.fds for s in early)
        if not late:
            transient = is_transient(role)
            found.append(Growth(key, role, pid, "gone", rss0, None, fds0, None, None if transient else False))
            continue
        rss1, fds1 = statistics.median(s.rss_bytes for s in late), statistics.median(s.fds for s in late)
        passed = _within(rss0, rss1, limit, rss_slack_bytes) and _within(fds0, fds1, limit, fd_slack)
        found.append(Growth(key, role, pid, "measured", rss0, rss1, fds0, fds1, passed))
    return found


@dataclass(frozen=True)
class Verdict:
    name: str  # growth | p99 | lost | wrong
    passed: bool
    line: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verdicts(
    window_list: Sequence[Window],
    growths: Sequence[Growth],
    *,
    limit: float = 0.05,
    p99_ratio: float = 1.5,
) -> list[Verdict]:
    lost = sum(w.lost for w in window_list)
    wrong = sum(w.wrong for w in window_list)
    probes = sum(w.probes for w in window_list)
    return [
        _growth_verdict(window_list, growths, limit),
        _p99_verdict(window_list, p99_ratio),
        Verdict("lost", lost == 0, f"lost: {lost} request(s) without an answer or an error (0 wanted)"),
        Verdict(
            "wrong",
            wrong == 0 and probes > 0,
            f"wrong: {wrong} of {probes} probe answer(s) differ from the first (0 wanted)"
            + ("" if probes else "; no probe was answered: not judged"),
        ),
    ]


def _growth_verdict(window_list: Sequence[Window], growths: Sequence[Growth], limit: float) -> Verdict:
    if len(window_list) < 3:
        return Verdict("growth", False, f"growth: not judged ({len(window_list)} window(s); 3 needed)")
    measured = [g for g in growths if g.status == "measured"]
    failed = [g for g in growths if g.passed is False]
    if not measured:
        return Verdict("growth", False, "growth: not judged (no process sampled in both the second and last window)")
    worst = max(measured, key=lambda g: max(g.rss_growth or 0.0, g.fds_growth or 0.0))
    text = (
        f"growth after warm-up (window 1 → {len(window_list) - 1}): {len(measured) - len(failed)} of "
        f"{len(measured)} processes within {limit:.0%} (or 8 MiB / 2 FDs) in RSS and open FDs; largest "
        f"{worst.key} RSS {_signed(worst.rss_growth)}, FDs {_signed(worst.fds_growth)}"
    )
    if failed:
        text += "; over the limit or gone: " + ", ".join(
            f"{g.key} ({'gone' if g.status == 'gone' else f'RSS {_signed(g.rss_growth)}, FDs {_signed(g.fds_growth)}'})"
            for g in failed
        )
    return Verdict("growth", not failed, text)


def _p99_verdict(window_list: Sequence[Window], ratio: float) -> Verdict:
    if len(window_list) < 3:
        return Verdict("p99", False, f"p99: not judged ({len(window_list)} window(s); 3 needed)")
    second, last = window_list[1].e2e_p99_s, window_list[-1].e2e_p99_s
    if second is None or last is None:
        return Verdict("p99", False, "p99: not judged (the second or the last window answered nothing)")
    passed = last <= ratio * second
    return Verdict(
        "p99",
        passed,
        f"p99 stable: last window {last:.3g} s vs second {second:.3g} s (×{last / second:.2f}; ≤ ×{ratio:g} wanted)",
    )


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1%}"
