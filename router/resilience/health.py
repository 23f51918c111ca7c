"""Per-target health: a green / yellow / red / black state machine.

Why a state machine and not "switch on the first timeout": most timeouts are jitter, and moving all
traffic at once floods the fallback. So a suspect target (yellow) keeps ~70% of new requests and sheds
~30%; only persistent or certain failure (red) moves everything. Recovery is quick but graded: after a
short cool-down the target is half-open (a small share of live requests go to it as trials, and its
probes run more often); the first live success, or a short streak of good probes, starts a 20% → 50%
→ 100% ramp, because targets that were flipped back to full traffic at once have been seen to fall
over again. Black is for credential failures, which no amount of retrying fixes; its probes are only
believed after `black_retry_s`.

Live traffic outranks probes (router/resilience/health_evidence.py): while a live outcome is at most
`live_evidence_s` old, liveness and latency probes are recorded but do not move the state.

Pure: inputs are method calls, time comes from the injected clock, and time-driven transitions are
evaluated lazily (on every input and read), stamped with the moment they became due.

    from            event                                                    to
    --------------  -------------------------------------------------------  -------------------------
    green           a failed probe that counts (any level)                   yellow
    green           live error ratio >= yellow_error_ratio over window_s
                    with >= min_requests outcomes                            yellow
    green / yellow  red_probe_failures consecutive counted failed liveness
                    probes                                                   red
    green / yellow  red_live_failures consecutive failed live requests       red
    yellow          no failure (probe or live) for yellow_clear_s            green
    yellow          still yellow red_after_s after entering it               red
    any but black   mark_down(reason), e.g. every replica's stats stale      red
    red             cooldown_s since entering red                            half-open (red, share
                                                                             half_open_share)
    red, half-open  >= recovery_probes consecutive good counted probes AND
                    cooldown_s since entering red                            ramping at ramp[0] (yellow)
    half-open       a live request succeeds                                  ramping at ramp[0]
    half-open       a live request fails, or a counted probe fails           red (the cool-down restarts)
    ramping         ramp_step_s at a share without a failure                 next share (yellow < 1.0,
                                                                             green at 1.0)
    ramping at end  ramp_step_s at the last share                            green, ramp complete
    ramping         any counted failed probe or live failure                 red (recovery starts over)
    any             credential_failed()                                      black
    black           good probe at least black_retry_s after entering black   red
    black           anything else (probes before black_retry_s, live traffic,
                    mark_down)                                               black

Inside red a failed probe or live failure resets the good-probe streak; a live request that was
sent before the target went red and succeeds during the cool-down proves nothing new (as for a
breaker). Shares: green 1.0, yellow `yellow_share`, red 0 (half-open `half_open_share`), black 0,
ramping the current ramp share; `admits(draw)` is `draw < share()`.

Timeline with the defaults, a provider that is down and comes back: detection by live traffic
(5 consecutive failures: red at once; a 20% error ratio: yellow) or, without traffic, by 3 failed
liveness probes (~30 s); red holds 10 s (`cooldown_s`), then half-open: 10% of new requests are
trials and probes run every `resilience.health.recovery_probe_s` (5 s). Once the target answers, the
first live trial that succeeds starts the ramp at once; without traffic 2 good probes do (live
evidence older than `live_evidence_s`, 10 s, no longer outranks them): the ramp starts within
~15 s of recovery, then 20% and 50% for 10 s each and 100% 20 s later.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import get_args

from pydantic import Field, model_validator

from router.resilience.health_evidence import Evidence, ProbeLevel
from router.settings_base import StrictModel

Clock = Callable[[], float]

MAX_TRANSITIONS = 50  # how many transitions each machine keeps for metrics / decision records
_NEVER = float("inf")


class Health(StrEnum):
    GREEN = "green"
    YELLOW = "yellow"
    RED = "red"
    BLACK = "black"


class HealthSettings(StrictModel):
    """What the state machine needs: the `resilience.health` section of the config file without its probe
    schedule (cluster/config/resilience.py adds that)."""

    window_s: float = Field(120.0, gt=0, description="live outcomes considered")
    min_requests: int = Field(5, ge=1, description="live outcomes needed in the window before their error ratio counts")
    yellow_error_ratio: float = Field(0.2, gt=0, le=1, description="live error ratio that turns a green target yellow")
    yellow_share: float = Field(0.7, ge=0, le=1, description="share of new requests a yellow target keeps")
    red_after_s: float = Field(120.0, gt=0, description="yellow this long becomes red")
    red_probe_failures: int = Field(3, ge=1, description="consecutive failed liveness probes: red at once")
    red_live_failures: int = Field(5, ge=1, description="consecutive failed live requests: red at once")
    recovery_probes: int = Field(
        2, ge=1, description="consecutive good probes that start the ramp back (once the cool-down is over)"
    )
    cooldown_s: float = Field(10.0, ge=0, description="minimum time in red; then half-open")
    half_open_share: float = Field(
        0.1,
        ge=0,
        le=1,
        description="share of new requests a half-open target (red, cool-down over) takes as trials; the first "
        "that succeeds starts the ramp, one that fails restarts the cool-down",
    )
    live_evidence_s: float = Field(
        10.0,
        ge=0,
        description="a live outcome at most this old outranks liveness and latency probes: they are recorded "
        "(and counted as overruled when they disagree) but do not move the state",
    )
    ramp: tuple[float, ...] = Field((0.2, 0.5, 1.0), min_length=1, description="shares while ramping back")
    ramp_step_s: float = Field(10.0, ge=0, description="each ramp share held this long without failures")
    black_retry_s: float = Field(600.0, ge=0, description="after a credential failure, probes believed after this")
    yellow_clear_s: float = Field(30.0, ge=0, description="yellow with a clean window this long: green")

    @model_validator(mode="after")
    def _ramp_rises_to_one(self) -> HealthSettings:
        ramp = self.ramp
        if any(not 0 < share <= 1 for share in ramp) or list(ramp) != sorted(ramp) or ramp[-1] != 1.0:
            raise ValueError("health ramp must be rising shares in (0, 1] ending with 1.0")
        return self


@dataclass(frozen=True)
class Transition:
    at: float  # when the transition became due (clock seconds)
    from_state: Health
    to_state: Health  # equal to from_state for ramp steps, half-open and "ramp complete"
    reason: str
    share: float  # the share of new requests the target takes after the transition


class HealthMachine:
    """One target's health; feed it probes and live outcomes, read `state`, `share()`, `admits()`."""

    def __init__(self, target: str, settings: HealthSettings, clock: Clock) -> None:
        self.target = target
        self._s = settings
        self._clock = clock
        self._state = Health.GREEN
        self._since = clock()  # when the current state was entered (red: when its cool-down began)
        self._reason = "no failures seen"
        self._half_open = False
        self._ramp_step: int | None = None  # index into settings.ramp while ramping
        self._ramp_since = 0.0
        self._outcomes: deque[tuple[float, bool]] = deque()
        self._last_failure = self._since
        self._liveness_failures = 0  # consecutive, counted probes
        self._live_failures = 0  # consecutive live outcomes
        self._good_probes = 0  # consecutive, counted while red
        self._streak_done_at: float | None = None  # when the good-probe streak reached recovery_probes
        self._transitions: deque[Transition] = deque(maxlen=MAX_TRANSITIONS)
        self.transitions_total = 0  # every transition ever, including those the deque dropped
        self.evidence = Evidence(settings.live_evidence_s)

    # -- outputs ---------------------------------------------------------------------------------
    @property
    def state(self) -> Health:
        self._tick(self._clock())
        return self._state

    @property
    def ramping(self) -> bool:
        self._tick(self._clock())
        return self._ramp_step is not None

    @property
    def half_open(self) -> bool:
        """Red, its cool-down over: a small share of live requests go to it as trials."""
        self._tick(self._clock())
        return self._half_open

    @property
    def reason(self) -> str:
        self._tick(self._clock())
        return self._reason

    @property
    def transitions(self) -> list[Transition]:
        self._tick(self._clock())
        return list(self._transitions)

    def share(self) -> float:
        self._tick(self._clock())
        return self._share()

    def admits(self, draw: float) -> bool:
        """`draw` in [0, 1) from the caller's seeded Random; randomness stays injectable."""
        return draw < self.share()

    # -- inputs ----------------------------------------------------------------------------------
    def probe(self, level: ProbeLevel, ok: bool) -> None:
        if level not in get_args(ProbeLevel):
            raise ValueError(f"unknown probe level {level!r}; expected one of {get_args(ProbeLevel)}")
        now = self._clock()
        self._tick(now)
        if self._state is Health.BLACK:
            self.evidence.saw_probe(now, level, ok)
            waited = now - self._since
            if ok and waited >= self._s.black_retry_s:
                self._enter_red(now, f"good {level} probe {waited:.0f}s after the credential failure")
            return  # earlier probes are not believed: the credential was rejected, not the network
        if not self.evidence.saw_probe(now, level, ok):
            return  # live traffic outranks this probe: recorded, state kept
        if level == "liveness":
            self._liveness_failures = 0 if ok else self._liveness_failures + 1
        if ok:
            if self._state is Health.RED and self._ramp_step is None:
                self._good_probes += 1
                if self._good_probes == self._s.recovery_probes:
                    self._streak_done_at = now
                self._tick(now)
            return
        self._failure(now)
        if self._liveness_failures >= self._s.red_probe_failures:
            self._enter_red(now, f"{self._liveness_failures} consecutive liveness probes failed")
        elif self._ramp_step is not None:
            self._enter_red(now, f"{level} probe failed while ramping at {self._share():.0%}: recovery starts over")
        elif self._half_open:
            self._enter_red(now, f"{level} probe failed while half-open: the cool-down starts again")
        elif self._state is Health.GREEN:
            self._enter(Health.YELLOW, now, f"{level} probe failed")

    def probe_rejected(self, level: ProbeLevel, detail: str) -> None:
        """The target refused the probe's request itself (a client-side 4xx): no evidence of ill
        health either way; counted and kept for the operator, the state is kept."""
        self.evidence.saw_rejection(level, detail)

    def outcome(self, ok: bool) -> None:
        now = self._clock()
        self._tick(now)
        if self._state is Health.BLACK:
            return
        self.evidence.saw_live(now, ok)
        self._outcomes.append((now, ok))
        horizon = now - self._s.window_s
        while self._outcomes and self._outcomes[0][0] <= horizon:
            self._outcomes.popleft()
        self._live_failures = 0 if ok else self._live_failures + 1
        if ok:
            if self._half_open:
                self._start_ramp(now, "a live request succeeded while half-open")
            return
        self._failure(now)
        if self._ramp_step is not None:
            self._enter_red(now, f"request failed while ramping at {self._share():.0%}: recovery starts over")
        elif self._half_open:
            self._enter_red(now, "trial request failed while half-open: the cool-down starts again")
        elif self._state is not Health.RED and self._live_failures >= self._s.red_live_failures:
            self._enter_red(now, f"{self._live_failures} consecutive requests failed")
        elif self._state is Health.GREEN:
            total = len(self._outcomes)
            failed = sum(1 for _, good in self._outcomes if not good)
            if total >= self._s.min_requests and failed / total >= self._s.yellow_error_ratio:
                self._enter(
                    Health.YELLOW,
                    now,
                    f"error ratio {failed / total:.2f} over {total} requests in {self._s.window_s:g}s"
                    f" >= {self._s.yellow_error_ratio:g}",
                )

    def credential_failed(self, detail: str = "") -> None:
        """Black from anywhere; repeating it restarts the black_retry_s wait."""
        now = self._clock()
        self._tick(now)
        self._ramp_step, self._half_open = None, False
        reason = f"credential failed{': ' + detail if detail else ''}"
        if self._state is Health.BLACK:
            self._since, self._reason = now, reason
        else:
            self._enter(Health.BLACK, now, reason)

    def mark_down(self, reason: str) -> None:
        """Red at once on outside evidence (e.g. every replica's stats went stale); black stays black."""
        now = self._clock()
        self._tick(now)
        if self._state is not Health.BLACK:
            self._enter_red(now, reason)

    # -- internals -------------------------------------------------------------------------------
    def _share(self) -> float:
        if self._ramp_step is not None:
            return self._s.ramp[self._ramp_step]
        if self._half_open:
            return self._s.half_open_share
        return {Health.GREEN: 1.0, Health.YELLOW: self._s.yellow_share}.get(self._state, 0.0)

    def _enter(self, to: Health, at: float, reason: str) -> None:
        before = self._state
        self._state, self._since, self._reason = to, at, reason
        self._transitions.append(Transition(at, before, to, reason, self._share()))
        self.transitions_total += 1

    def _failure(self, now: float) -> None:
        self._last_failure = now
        self._good_probes = 0
        self._streak_done_at = None

    def _enter_red(self, at: float, reason: str) -> None:
        self._good_probes, self._streak_done_at = 0, None
        if self._state is Health.RED and self._ramp_step is None and not self._half_open:
            self._reason = reason  # still cooling down; the cool-down keeps counting from entering red
            return
        self._ramp_step, self._half_open = None, False
        self._enter(Health.RED, at, reason)

    def _start_ramp(self, at: float, why: str) -> None:
        self._ramp_step, self._ramp_since, self._half_open = 0, at, False
        self._outcomes.clear()  # judge the recovered target on fresh traffic only
        self._liveness_failures = self._live_failures = 0
        share = self._s.ramp[0]
        self._enter(Health.GREEN if share >= 1.0 else Health.YELLOW, at, f"{why}: ramp to {share:.0%}")

    def _tick(self, now: float) -> None:
        """Apply every time-driven transition due by `now`, each stamped with when it became due."""
        while True:
            if self._ramp_step is not None:
                due = self._ramp_since + self._s.ramp_step_s
                if now < due:
                    return
                held = self._s.ramp[self._ramp_step]
                if self._ramp_step + 1 < len(self._s.ramp):
                    self._ramp_step += 1
                    self._ramp_since = due
                    share = self._s.ramp[self._ramp_step]
                    reason = f"ramp {held:.0%} held {self._s.ramp_step_s:g}s: ramp to {share:.0%}"
                    self._enter(Health.GREEN if share >= 1.0 else Health.YELLOW, due, reason)
                else:
                    self._ramp_step = None
                    self._enter(Health.GREEN, due, f"ramp complete at {held:.0%}")
            elif self._state is Health.YELLOW:
                clear_at = self._last_failure + self._s.yellow_clear_s
                red_at = self._since + self._s.red_after_s
                if now < min(clear_at, red_at):
                    return
                if clear_at <= red_at:
                    self._enter(Health.GREEN, clear_at, f"no failures for {self._s.yellow_clear_s:g}s")
                else:
                    self._enter_red(red_at, f"yellow for {self._s.red_after_s:g}s")
            elif self._state is Health.RED:
                cooled_at = self._since + self._s.cooldown_s
                ramp_at = _NEVER if self._streak_done_at is None else max(self._streak_done_at, cooled_at)
                half_open_at = _NEVER if self._half_open else cooled_at
                if now < min(ramp_at, half_open_at):
                    return
                if ramp_at <= half_open_at:
                    probes, cooled = self._s.recovery_probes, self._s.cooldown_s
                    self._start_ramp(ramp_at, f"{probes} good probes and {cooled:g}s cool-down")
                else:
                    self._half_open = True
                    share = self._s.half_open_share
                    reason = f"{self._s.cooldown_s:g}s cool-down over: half-open, {share:.0%} of new requests as trials"
                    self._transitions.append(Transition(half_open_at, Health.RED, Health.RED, reason, share))
                    self.transitions_total += 1
                    self._reason = reason
            else:
                return


class HealthBoard:
    """Health machines keyed by target id, created on demand with shared settings and clock."""

    def __init__(self, settings: HealthSettings, clock: Clock) -> None:
        self._settings = settings
        self._clock = clock
        self._machines: dict[str, HealthMachine] = {}

    def get(self, target: str) -> HealthMachine:
        if target not in self._machines:
            self._machines[target] = HealthMachine(target, self._settings, self._clock)
        return self._machines[target]

    def states(self) -> dict[str, str]:
        return {target: machine.state.value for target, machine in self._machines.items()}

    def reset(self, target: str | None = None) -> list[str]:
        """Operator action: forget the machine of `target` (or every machine), which starts green
        again on its next use. Black needs this, or `black_retry_s`, once the key is fixed."""
        keys = [k for k in self._machines if target is None or k == target]
        for key in keys:
            del self._machines[key]
        return [f"health:{k}" for k in keys]
