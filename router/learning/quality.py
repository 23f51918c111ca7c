"""Per-bucket quality learned from outcomes: what a target is really worth for a kind of request.

A bucket is the part of a request's contract that changes how well a model does it:

    task      the contract's scenario (declared, typed by router/request/typing_rules.py, or the default)
    lang      the script of the prompt (router/request/language.py): zh, ja, ko, cyrillic, arabic, latin, other, none
    len       prompt length band of the estimated prompt tokens: short < 256 <= medium < 2048 <= long
              < 16384 <= xlong
    tools     tools or not (needs_tools)
    risk      the contract's level, L1 / L2 / L3

    key "task=default|lang=latin|len=short|tools=0|risk=L2"

Evidence per (target, bucket): an answered attempt is a success and adds its latency; an attempt
whose answer broke its output contract is a failure and a contract violation; failed calls (errors,
timeouts) are availability, not quality (health and breakers see them) and are only counted.
Feedback (`POST /v1/spillover/feedback`) adds a success or a failure for the target that answered,
kept per tenant: a tenant's verdicts move the estimate of ITS requests only, unless they are shared
(an admin tenant's, or a tenant with `global_feedback`; everyone's without auth): shared verdicts
move every tenant's estimate, each tenant's weighted down to at most `max_feedback_per_tenant`
samples, so one tenant's volume cannot outweigh the others' or the observed answers.

Estimate: the posterior mean of a Beta prior centred on the target's configured quality q0 with
`prior_strength` pseudo-samples, Beta(q0·n0, (1 − q0)·n0), updated with the successes and
failures. It is conservative twice: few samples barely move it off the configured value, and the
scorer uses it only once the bucket has `min_samples` samples (before that `estimate` is None
and the configured number stands). Buckets are bounded (`max_buckets`, least recently updated
evicted) and so are the latency samples per bucket (`latency_window`). Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from router.learning.decision import DecisionRecord
from router.percentile import percentile
from router.request.contract import RequestContract

LENGTH_BANDS: tuple[tuple[int, str], ...] = ((256, "short"), (2048, "medium"), (16384, "long"))


def length_band(prompt_tokens: int) -> str:
    return next((name for limit, name in LENGTH_BANDS if prompt_tokens < limit), "xlong")


def _key(task: Any, lang: Any, prompt_tokens: int, tools: bool, risk: Any) -> str:
    return f"task={task}|lang={lang or 'none'}|len={length_band(prompt_tokens)}|tools={int(tools)}|risk={risk}"


def bucket_key(contract: Mapping[str, Any]) -> str:
    """The bucket of a contract given as `RequestContract.to_dict()` (as records hold it)."""
    c = contract
    tokens = int(c.get("est_prompt_tokens") or 0)
    return _key(c.get("scenario"), c.get("language"), tokens, bool(c.get("needs_tools")), c.get("level"))


def contract_bucket(contract: RequestContract) -> str:
    """The same key, from the contract itself (the dispatcher's plan)."""
    c = contract
    return _key(c.scenario, c.language, c.est_prompt_tokens, c.needs_tools, c.level)


def answered_by(record: DecisionRecord) -> str | None:
    """The target whose answer the client got (the last attempt that answered); None when none did."""
    if record.chosen is None:
        return None
    return next((a.target for a in reversed(record.attempts) if a.outcome == "ok"), None)


def beta_mean(prior_mean: float, prior_strength: float, successes: float, failures: float) -> float:
    """Posterior mean of Beta(prior_mean·n0, (1 − prior_mean)·n0) after the samples."""
    alpha = prior_mean * prior_strength + successes
    beta = (1.0 - prior_mean) * prior_strength + failures
    return alpha / (alpha + beta) if alpha + beta > 0 else prior_mean


@dataclass
class Tally:
    successes: int = 0
    failures: int = 0

    @property
    def samples(self) -> int:
        return self.successes + self.failures

    def weighted(self, cap: float) -> tuple[float, float]:
        """(successes, failures) scaled so that together they count for at most `cap` samples."""
        scale = min(1.0, cap / self.samples) if self.samples else 0.0
        return self.successes * scale, self.failures * scale


@dataclass
class BucketStats:
    latency_window: int = 200
    successes: int = 0  # observed answers, every tenant's
    failures: int = 0
    violations: int = 0
    errors: int = 0
    feedback: int = 0  # reports of every tenant
    own: dict[str, Tally] = field(default_factory=dict)  # tenant -> feedback moving its own requests only
    shared: dict[str, Tally] = field(default_factory=dict)  # tenant -> feedback moving every tenant's
    latencies: deque[float] = field(default_factory=deque)

    @property
    def samples(self) -> int:
        return self.successes + self.failures

    def evidence(self, tenant: str | None, cap: float) -> tuple[float, float]:
        """(successes, failures) a request of `tenant` is routed by (None: the shared evidence only)."""
        successes, failures = float(self.successes), float(self.failures)
        for tally in self.shared.values():
            s, f = tally.weighted(cap)
            successes, failures = successes + s, failures + f
        own = self.own.get(tenant) if tenant is not None else None
        if own is not None:
            s, f = own.weighted(cap)
            successes, failures = successes + s, failures + f
        return successes, failures

    def latency(self, seconds: float) -> None:
        self.latencies.append(seconds)
        while len(self.latencies) > self.latency_window:
            self.latencies.popleft()

    def view(self, prior_mean: float, prior_strength: float, min_samples: int, cap: float) -> dict[str, Any]:
        """What every tenant is routed by (observed answers and shared feedback), and each tenant's own."""
        lat = list(self.latencies)
        p50, p95 = percentile(lat, 50), percentile(lat, 95)
        successes, failures = self.evidence(None, cap)
        samples = successes + failures
        by_tenant = {
            name: {"successes": tally.successes, "failures": tally.failures, "moves": moves}
            for moves, tallies in (("own", self.own), ("everyone", self.shared))
            for name, tally in sorted(tallies.items())
        }
        return {
            "samples": round(samples, 2),
            "successes": round(successes, 2),
            "failures": round(failures, 2),
            "success_rate": round(successes / samples, 4) if samples else None,
            "contract_violation_rate": round(self.violations / self.samples, 4) if self.samples else None,
            "errors": self.errors,
            "feedback": self.feedback,
            "feedback_by_tenant": by_tenant,
            "latency_p50_s": None if p50 is None else round(p50, 4),
            "latency_p95_s": None if p95 is None else round(p95, 4),
            "prior": round(prior_mean, 4),
            "estimate": round(beta_mean(prior_mean, prior_strength, successes, failures), 4),
            "used": samples >= min_samples,
        }


class QualityBook:
    """Evidence per (target id, bucket key); `prior` gives each target's configured quality."""

    def __init__(
        self,
        prior: Mapping[str, float],
        *,
        min_samples: int = 20,
        prior_strength: float = 10.0,
        max_buckets: int = 2000,
        latency_window: int = 200,
        max_feedback_per_tenant: float = 10.0,
    ) -> None:
        self._prior = dict(prior)
        self.min_samples = min_samples
        self.prior_strength = prior_strength
        self.max_feedback_per_tenant = max_feedback_per_tenant
        self._max = max_buckets
        self._window = latency_window
        self._stats: OrderedDict[tuple[str, str], BucketStats] = OrderedDict()

    def _get(self, target: str, bucket: str) -> BucketStats:
        key = (target, bucket)
        stats = self._stats.pop(key, None) or BucketStats(self._window)
        self._stats[key] = stats  # most recently updated last
        while len(self._stats) > self._max:
            self._stats.popitem(last=False)
        return stats

    def observe(self, record: DecisionRecord) -> None:
        """A finished request's attempts, in the bucket of its contract."""
        tried = ((a.target, a.outcome, a.latency_s) for a in record.attempts)
        self.observe_attempts(bucket_key(record.contract), tried)

    def observe_attempts(self, bucket: str, attempts: Iterable[tuple[str, str, float]]) -> None:
        """Attempts (target, outcome, latency in s) of one request in `bucket` (another replica's, pooled)."""
        for target, outcome, latency_s in attempts:
            if outcome == "skipped":
                continue
            stats = self._get(target, bucket)
            if outcome == "ok":
                stats.successes += 1
                stats.latency(latency_s)
            elif outcome == "contract_violation":
                stats.failures += 1
                stats.violations += 1
            else:
                stats.errors += 1

    def feedback(self, record: DecisionRecord, success: bool, owner: str = "", *, shared: bool = True) -> bool:
        """`owner`'s verdict on the answer `record.chosen` gave; False when no target answered. Not
        `shared`: it moves only `owner`'s requests."""
        target = answered_by(record)
        if target is None:
            return False
        self.feedback_on(target, bucket_key(record.contract), success, owner, shared=shared)
        return True

    def feedback_on(self, target: str, bucket: str, success: bool, owner: str, *, shared: bool) -> None:
        """A verdict on `target`'s answer in `bucket` (feedback's evidence; another replica's, pooled)."""
        stats = self._get(target, bucket)
        stats.feedback += 1
        tally = (stats.shared if shared else stats.own).setdefault(owner, Tally())
        if success:
            tally.successes += 1
        else:
            tally.failures += 1

    def estimate(self, target: str, bucket: str, tenant: str | None = None) -> float | None:
        """The learned quality for a request of `tenant` once its evidence holds `min_samples`
        samples, else None (`tenant` None: the evidence every tenant shares)."""
        stats = self._stats.get((target, bucket))
        if stats is None:
            return None
        successes, failures = stats.evidence(tenant, self.max_feedback_per_tenant)
        if successes + failures < self.min_samples:
            return None
        prior = self._prior.get(target, 0.5)
        # evidence may only lower the configured quality: a run of accepted answers says the target is not
        # worse than configured, not that it beats another target whose bucket saw less traffic
        return min(prior, beta_mean(prior, self.prior_strength, successes, failures))

    def estimates(self, targets: list[str], bucket: str, tenant: str | None = None) -> dict[str, float]:
        found = {t: self.estimate(t, bucket, tenant) for t in targets}
        return {t: q for t, q in found.items() if q is not None}

    def view(self) -> dict[str, Any]:
        buckets: dict[str, dict[str, Any]] = {}
        cap = self.max_feedback_per_tenant
        for (target, bucket), stats in self._stats.items():
            prior = self._prior.get(target, 0.5)
            buckets.setdefault(target, {})[bucket] = stats.view(prior, self.prior_strength, self.min_samples, cap)
        return {
            "min_samples": self.min_samples,
            "prior_strength": self.prior_strength,
            "max_feedback_per_tenant": cap,
            "bucket_key": "task|lang|len|tools|risk",
            "targets": buckets,
        }
