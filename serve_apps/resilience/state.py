"""The gateway's resilience state, and the one place an attempt's outcome updates all of it.

A gateway replica holds one `Resilience`: circuit breakers per target and failure domain
(`router.resilience.breaker`), a health machine per local model and cloud provider (`router.resilience.health`), the
gateway-wide retry budget and the backoff (`router.resilience.retry`), per-provider RPM/TPM windows
(serve_apps/limits/provider_quotas.py: in the store the replicas share, the providers' rate-limit
headers per replica) and the spend ledger
(`serve_apps.limits.spend_ledger`). The dispatcher asks it three things:

* `unavailable(targets)` at plan time: a local model that has not passed its start-up golden
  check (`serve_apps.resilience.golden_gate`), black health, red health still in its cool-down, an open
  breaker, or (local) every replica's stats stale right now takes a target out of the ranked tiers
  (the decision record says why); health reddens on sustained staleness only (`watch_local`);
* `gate(target, ...)` just before an attempt: a half-open breaker's trial slot, the health share
  (yellow keeps ~70%, half-open red ~10% as trials, a ramp 20/50/100%) when there is another
  candidate, the provider's quota (awaited: one store operation per limit);
* `failed(target, error)` / `succeeded(target)` after it: `router.resilience.failure`'s table decides what
  the error means for the breakers, the domain's cool-down and the health.

Health keys are the `x-spillover-target` forms: `local:<alias>` and `cloud:<provider>`.

Clocks: everything here runs on `clock`, monotonic in production (`time.monotonic`): a step of
the wall clock (NTP, an operator) never opens or closes a breaker, ends a cool-down, slides a
quota window or moves a health machine. Wall time (`wall`) appears only where a person or
another process reads it: transition times in `view()` and the breakers' export. A provider's
Retry-After is capped at `resilience.retry.max_retry_after_s` where it enters this state (the
domain's cool-down, the backoff and the Retry-After the client is given).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cluster.config.deployment import SpilloverConfig
from router.errors import ProviderOverloaded, ProviderRateLimited, RequestError
from router.learning.decision import Attempt
from router.limits.budget import cost_weight
from router.limits.quota import Refusal, Reservation
from router.limits.rate_headers import read_rate_limits
from router.resilience.breaker import Breakers
from router.resilience.failure import Rule, rule_for
from router.resilience.health import Health, HealthBoard, HealthMachine
from router.resilience.retry import WAIT_OUT_MARGIN_S, WAIT_OUT_SLACK_S, Backoff, RetryBudget
from router.routing.capabilities import Target, local_id
from router.routing.policy import Policy
from router.routing.snapshot import ClusterSnapshot
from serve_apps.limits.provider_quotas import SharedQuotas
from serve_apps.limits.spend_ledger import SpendLedger
from serve_apps.resilience.golden_gate import GoldenGate
from serve_apps.resilience.learned_windows import LearnedWindows
from serve_apps.state.memory import MemoryStore
from serve_apps.state.store import SharedStore

DEFAULT_COOL_S = 1.0  # a 429 without Retry-After cools its domain this long
POLICY_REFRESH_S = 10.0  # how often the month's spend is read back for the soft budget


@dataclass(frozen=True)
class Gate:
    """`refused` is None when the attempt may go; `reservation` is its quota slot (cloud)."""

    refused: str | None
    reservation: Reservation | None = None


class Resilience:
    def __init__(
        self,
        config: SpilloverConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        spend: SpendLedger | None = None,
        golden: GoldenGate | None = None,
        store: SharedStore | None = None,
    ) -> None:
        """`store` holds the providers' RPM / TPM windows (None: a MemoryStore of this replica's own)."""
        r = config.resilience
        self.golden = golden
        self._config = config
        self._clock = clock
        self._wall = wall
        self._rng = rng or random.Random()
        self.max_retry_after_s = r.retry.max_retry_after_s
        providers = config.cloud.providers
        self._domains = {p.name: p.failure_domain for p in providers}
        self.breakers = Breakers(r.breaker, clock, wall=wall, failure_domains=self._domains)
        self.health = HealthBoard(r.health, clock)  # the config section is the machine's settings
        retry = r.retry
        self.budget = RetryBudget(
            ratio=retry.budget_ratio, min_per_s=retry.budget_min_per_s, window_s=retry.budget_window_s, clock=clock
        )
        self.backoff = Backoff(base_s=retry.backoff_base_s, cap_s=retry.backoff_cap_s, rng=self._rng)
        self.max_attempts = retry.max_attempts
        limits = {p.name: (p.rpm, p.tpm) for p in providers}
        self.quotas = SharedQuotas(limits, store if store is not None else MemoryStore(clock=clock), clock=clock)
        self.spend = spend
        self._policy_cache: tuple[float, Policy] | None = None
        self._stale_red_s = r.health.stale_red_s
        self._stale_local: dict[str, str] = {}  # alias -> why, while every replica's stats are stale
        self._watched: dict[str, float] = {}  # alias -> the snapshot time watch_local first saw it
        self.windows = LearnedWindows()  # context windows providers turned out to have

    # -- plan time ---------------------------------------------------------------------------------
    def domain(self, target: Target) -> str:
        if target.kind == "local":
            return target.endpoint
        return self._domains.get(target.provider or "", target.provider or "")

    def shut_for_s(self, target: Target) -> float:
        """Seconds until the breakers of `target` and of its failure domain stop refusing it (0: they do not)."""
        waits = (self.breakers.domain(self.domain(target)).retry_in_s(), self.breakers.target(target.id).retry_in_s())
        return max((w for w in waits if w is not None), default=0.0)

    async def sleep_out(self, target: Target, delay_s: float, sleep: Callable[[float], Awaitable[None]]) -> None:
        """Sleep `delay_s` before retrying `target`; then, while a 429's cool-down holds it shut for only a little
        longer (router/resilience/retry.py WAIT_OUT_SLACK_S), that too. The sleep ends on the event loop's clock
        and the cool-down on the breakers' own: uvloop reads its clock once per loop turn, so on a busy loop a
        timer ends a few ms early, and a retry that early is refused ("cooling after 429 (retry in 0.0s)") and
        fails over, which waiting out the Retry-After was meant to avoid."""
        await sleep(delay_s)
        for _ in range(3):
            breakers = (self.breakers.domain(self.domain(target)), self.breakers.target(target.id))
            left = max((b.retry_in_s() or 0.0 for b in breakers if b.cause == "cooling"), default=0.0)
            if not 0 < left <= WAIT_OUT_SLACK_S:
                return
            await sleep(left + WAIT_OUT_MARGIN_S)

    def watch_local(self, alias: str, snapshot: ClusterSnapshot, now: float) -> None:
        """Stale stats divert traffic while they last; only sustained staleness reddens health.

        Every replica of the model stale (no fresh stats on the snapshot `now`, wall time like the
        replicas' `read_at`): traffic goes to the cloud from this moment (stale counts as saturated),
        and comes back with the first fresh reading. For one more `max_age_s` it is a late push: a
        request that may not leave (local_only, or no provider) waits for the next reading in the
        admission queue; past that the local target is unavailable (`unavailable()`, a local_only
        request gets a 503). Health turns red only once the newest reading is older than
        `max_age_s + resilience.health.stale_red_s` (30 s by default, three liveness periods), or
        when the liveness probes fail `red_probe_failures` times in a row: one late stats push
        must not take the model off for a whole red cool-down and ramp.

        Only staleness this gateway watched counts towards red: a reading older than the gateway's
        first look at the model (the board keeps a replaced replica's last reading for a while after
        a redeploy) diverts traffic but starts the red clock at that first look."""
        first_look = self._watched.setdefault(alias, now)
        replicas = snapshot.for_model(alias)
        if not replicas or not all(snapshot.unusable(r, now) for r in replicas):
            self._stale_local.pop(alias, None)
            return
        if faults := sorted({r.fault for r in replicas if r.fault and not snapshot.is_stale(r, now)}):
            # a replica that says it must not serve (numerics failed, engine stalled) leaves routing at
            # once and comes back with its first clean reading: no red cool-down and ramp on top
            self._stale_local[alias] = f"every replica of {alias} out of routing: {faults[0]}"
            return
        newest = min(r.age(now) for r in replicas)
        stale_for = newest - snapshot.max_age_s
        if stale_for <= snapshot.max_age_s:
            # a late push: the burst decision counts the replicas saturated (router/routing/burst.py), so
            # traffic bursts, and a request that may not leave waits a moment for the next reading
            self._stale_local.pop(alias, None)
        else:
            self._stale_local[alias] = f"every replica of {alias} stale ({stale_for:.1f}s past max_age_s)"
        watched_for = min(stale_for, now - first_look)
        machine = self.health.get(local_id(alias))
        if watched_for >= self._stale_red_s and machine.state not in (Health.RED, Health.BLACK):
            machine.mark_down(f"every replica of {alias} stopped reporting stats for {stale_for:.0f}s")

    def unavailable(self, targets: Iterable[Target]) -> dict[str, str]:
        out: dict[str, str] = {}
        for target in targets:
            if target.kind == "local" and self.golden is not None and (why := self.golden.blocked(target.alias)):
                out[target.id] = why
                continue
            if target.kind == "local" and target.alias in self._stale_local:
                out[target.id] = self._stale_local[target.alias]
                continue
            machine = self.health.get(target.endpoint)
            if _shut(machine):
                out[target.id] = f"health {machine.state.value}: {machine.reason}"
                continue
            domain = self.breakers.domain(self.domain(target))
            if not domain.can_allow():
                out[target.id] = f"domain {self.domain(target)} {domain.state} ({domain.cause})"
            elif not self.breakers.target(target.id).can_allow():
                out[target.id] = f"breaker {self.breakers.target(target.id).state}"
        return out

    def policy(self, base: Policy) -> Policy:
        """The policy with the soft monthly budget applied: past half the budget the cost weight
        of every strategy rises (up to `spend.max_cost_factor` at the budget)."""
        budget = self._config.spend.monthly_budget_usd
        if self.spend is None or budget is None:
            return base
        now = self._clock()
        if self._policy_cache is not None and now - self._policy_cache[0] < POLICY_REFRESH_S:
            return self._policy_cache[1]
        total = self.spend.recent_month_total()  # off the loop in the gateway; calendar months, wall clock
        factor = self._config.spend.max_cost_factor
        weights = {
            strategy: {**row, "cost": cost_weight(total, budget, base_weight=row.get("cost", 0.0), max_factor=factor)}
            for strategy, row in base.weights.items()
        }
        policy = base.model_copy(update={"weights": weights})
        self._policy_cache = (now, policy)
        return policy

    # -- attempt time ------------------------------------------------------------------------------
    async def gate(self, target: Target, *, has_alternative: bool, tokens: int) -> Gate:
        machine = self.health.get(target.endpoint)
        if _shut(machine):
            return Gate(f"{target.endpoint} is {machine.state.value}: {machine.reason}")
        if has_alternative and not machine.admits(self._rng.random()):
            share = machine.share()
            state = "red, half-open," if machine.half_open else machine.state.value
            return Gate(f"{target.endpoint} is {state} and takes {share:.0%} of new requests")
        allowed, why = self.breakers.allows(target.id, self.domain(target))
        if not allowed:
            return Gate(why)
        if target.kind == "local":
            return Gate(None)
        quota = await self.quotas.try_reserve(target.provider or "", tokens)
        if isinstance(quota, Refusal):
            return Gate(quota.reason)
        return Gate(None, quota)

    def failed(self, target: Target, error: RequestError) -> Rule:
        rule = rule_for(error)
        domain = self.domain(target)
        if rule.breaker_failure:
            self.breakers.record(target.id, domain, ok=False)
            self.health.get(target.endpoint).outcome(False)
        waits = isinstance(error, ProviderRateLimited | ProviderOverloaded)  # they carry a Retry-After
        if isinstance(error, ProviderRateLimited | ProviderOverloaded) and error.retry_after_s is not None:
            error.retry_after_s = self.capped_retry_after(error.retry_after_s)
        if rule.cools_domain:
            after = getattr(error, "retry_after_s", None) if waits else None
            self.breakers.cool_domain(domain, after if after is not None else DEFAULT_COOL_S)
        if rule.marks_black:
            self.health.get(target.endpoint).credential_failed(error.code or "")
        return rule

    def capped_retry_after(self, seconds: float) -> float:
        """A provider's Retry-After, at most `max_retry_after_s` (a hostile or broken provider must
        not close a failure domain for days); not a number → the cap."""
        return min(seconds, self.max_retry_after_s) if math.isfinite(seconds) else self.max_retry_after_s

    def output_failed(self, target: Target) -> None:
        """An answer that arrived but is unfit (a greedy loop: serve_apps/streams/output_loops.py): a health
        failure of the target, not a breaker one (the target answers; its answers are wrong)."""
        self.health.get(target.endpoint).outcome(False)

    def succeeded(self, target: Target) -> None:
        self.breakers.record(target.id, self.domain(target), ok=True)
        self.health.get(target.endpoint).outcome(True)

    def cut(
        self,
        request_id: str,
        target: Target,
        attempt: Attempt,
        reservation: Reservation | None,
        tokens: int,
        tenant: str | None,
    ) -> None:
        """An attempt cut before its answer (the request timed out, the client left): charged what it may
        have used (`attempt`, serve_apps/dispatch/record.py `cut_attempt`), its quota reservation settled at
        the estimate `tokens` (it was sent: it counts in the window), its half-open trial slots freed. Health
        and breakers hear nothing: the target was not wrong, only slower than what was left of the request."""
        self.charge(request_id, target, attempt.outcome, attempt.cost_usd, tenant)
        self.settle(reservation, tokens)
        self.breakers.release(target.id, self.domain(target))

    def settle(self, reservation: Reservation | None, tokens: int) -> None:
        if reservation is not None:
            self.quotas.settle(reservation, tokens)

    def observe_rate_limits(self, provider: str, headers: Mapping[str, str]) -> None:
        """A provider's rate-limit response headers (`router.limits.rate_headers`) update its quota window;
        resets are capped at `max_retry_after_s` like a Retry-After."""
        reading = read_rate_limits(headers, wall_now=self._wall(), max_reset_s=self.max_retry_after_s)
        if reading is not None:
            self.quotas.observe(provider, reading)

    def charge(
        self, request_id: str, target: Target, outcome: str, cost_usd: float | None, tenant: str | None = None
    ) -> None:
        if self.spend is not None and target.kind == "cloud":
            self.spend.add(request_id, target.id, target.provider or "", outcome, cost_usd or 0.0, tenant)

    # -- views -------------------------------------------------------------------------------------
    def states(self) -> dict[str, str]:
        """Health and breaker states, for decision records."""
        return {**self.health.states(), **{k: v for k, v in self.breakers.states().items() if v != "closed"}}

    def view(self) -> dict[str, Any]:
        """The whole picture for `/v1/spillover/cluster`."""
        health: dict[str, Any] = {}
        to_wall = self._wall() - self._clock()  # transition times are shown as epoch seconds
        for key, state in self.health.states().items():
            machine = self.health.get(key)
            evidence = machine.evidence
            live = evidence.live
            health[key] = {
                "state": state,
                "share": machine.share(),
                "ramping": machine.ramping,
                "half_open": machine.half_open,
                "reason": machine.reason,
                "live": None if live is None else {"ok": live.ok, "at": live.at + to_wall},
                "probes": {
                    level: {"ok": seen.ok, "at": seen.at + to_wall, "counted": seen.counted}
                    for level, seen in evidence.probes.items()
                },
                "disagreement": evidence.disagreement,
                "probes_overruled_total": evidence.overruled_total,
                "probe_rejections_total": evidence.rejections_total,
                "last_probe_rejection": evidence.last_rejection,
                "transitions_total": machine.transitions_total,
                "transitions": [
                    {"at": t.at + to_wall, "from": t.from_state, "to": t.to_state, "share": t.share, "reason": t.reason}
                    for t in machine.transitions[-10:]
                ],
            }
        spend = self.spend
        return {
            "health": health,
            "golden": self.golden.view() if self.golden is not None else {},
            "spend_ledger": {
                "write_failures": spend.write_failures if spend is not None else 0,
                "read_failures": spend.read_failures if spend is not None else 0,
            },
            "breakers": self.breakers.states(),
            "retry_budget": self.budget.balance(),
            "quotas": {name: {"requests": r, "tokens": t} for name, (r, t) in self.quotas.usage().items()},
            "provider_reported": self.quotas.reported(),
        }

    def reset(self, target: str | None = None) -> list[str]:
        """Operator reset (`POST /v1/spillover/resilience/reset`): forget health and breaker state,
        of one health key or of everything (and the context windows learnt of it). Returns what was reset."""
        return self.health.reset(target) + self.breakers.reset(target) + self.windows.reset(target)


def _shut(machine: HealthMachine) -> bool:
    """Takes no traffic at all: black, or red still in its cool-down (half-open takes trials)."""
    state = machine.state
    return state is Health.BLACK or (state is Health.RED and not machine.half_open)
