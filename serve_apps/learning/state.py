"""One gateway replica's learning state, wired from the config's `learning` section.

* `QualityBook` (router/learning/quality.py): fed every finished request's decision record through the
  dispatcher's observer (`observer()` wraps the metrics observer), read by the dispatcher's plan for
  the quality scorer, and by feedback.
* `FeedbackStore` (router/learning/feedback.py): reports from `POST /v1/spillover/feedback`, at most
  `learning.feedback.per_tenant_per_minute` per tenant (a token bucket per tenant on the monotonic
  clock; 429 feedback_rate_limited). A tenant's report moves its own routing and typing only, unless
  it shares feedback (`admin`, or `tenants[].global_feedback`; everyone's without auth).
* `RequestTyper` (router/request/typing_rules.py), when `learning.typing.enabled`: `derive()` types a request
  that declares no scenario before its contract is derived; the contract (and so the decision record)
  carries the typing result and its scores.
* `QualityCollector`: the book at `/metrics`, read at scrape time.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cluster.config.deployment import SpilloverConfig
from router import headers as hdr
from router.errors import FeedbackRateLimited
from router.learning.decision import DecisionRecord
from router.learning.feedback import Feedback, FeedbackInput, FeedbackStore
from router.learning.quality import QualityBook, answered_by, bucket_key
from router.limits.rate_limit import TokenBucket
from router.request.auth import TenantPolicy
from router.request.contract import RequestContract, derive_contract
from router.request.embedding import HashingEmbedder
from router.request.typing_rules import CentroidClassifier, RequestTyper, Rule, last_user_text
from router.routing.capabilities import Registry
from router.routing.policy import Policy
from serve_apps.dispatch.interfaces import DispatchObserver


@dataclass(frozen=True)
class FeedbackEvidence:
    """A verdict the quality book took: on `target`'s answer in `bucket`, by `owner`."""

    target: str
    bucket: str
    success: bool
    owner: str
    shared: bool


def plain_derive(
    body: Mapping[str, Any], headers: Mapping[str, str], policy: Policy, tenant: TenantPolicy | None, request_id: str
) -> RequestContract:
    """The contract without typing (`Learning.derive`'s signature, for a gateway without learning)."""
    return derive_contract(body, headers, policy)


def typer_for(config: SpilloverConfig) -> RequestTyper | None:
    section = config.learning.typing
    if not section.enabled:
        return None
    rules = [
        Rule(
            r.scenario,
            re.compile(r.pattern) if r.pattern is not None else None,
            frozenset(k.lower() for k in r.keywords),
            frozenset(r.tenants) if r.tenants is not None else None,
        )
        for r in section.rules
    ]
    classifier = None
    if section.examples:
        classifier = CentroidClassifier(HashingEmbedder(), section.examples, max_examples=section.max_examples)
    return RequestTyper(config.policy, rules, classifier, min_similarity=section.min_similarity)


def quality_book_for(config: SpilloverConfig, registry: Registry | None = None) -> QualityBook | None:
    """The learned quality per bucket, seeded with each target's configured quality; `registry`: the
    gateway's one registry of targets, else one of `config`."""
    section = config.learning.quality
    if not section.enabled:
        return None
    registry = registry or Registry.from_config(config.models, config.cloud.providers)
    return QualityBook(
        {t.id: t.caps.quality for t in registry.targets},
        min_samples=section.min_samples,
        prior_strength=section.prior_strength,
        max_buckets=section.max_buckets,
        latency_window=section.latency_window,
        max_feedback_per_tenant=section.max_feedback_per_tenant,
    )


class LearningObserver:
    """The dispatcher's observer: everything goes to `inner` (metrics); records also feed the book."""

    def __init__(
        self, inner: DispatchObserver, book: QualityBook, on_recorded: list[Callable[[DecisionRecord], None]]
    ) -> None:
        self._inner = inner
        self._book = book
        self._on_recorded = on_recorded

    def waiting(self, model: str, count: int) -> None:
        self._inner.waiting(model, count)

    def waited(self, model: str, seconds: float, outcome: str) -> None:
        self._inner.waited(model, seconds, outcome)

    def decided(self, seconds: float) -> None:
        self._inner.decided(seconds)

    def stream_repaired(self, target: str, kind: str) -> None:
        self._inner.stream_repaired(target, kind)

    def recorded(self, record: DecisionRecord) -> None:
        self._inner.recorded(record)
        self._book.observe(record)
        for hook in self._on_recorded:
            hook(record)


class QualityCollector(Collector):
    """spillover_quality_estimate / _samples / _success_rate {target,bucket}, at scrape time."""

    def __init__(self, book: QualityBook) -> None:
        self._book = book

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["target", "bucket"]
        estimate = GaugeMetricFamily("spillover_quality_estimate", "Learned quality (posterior mean)", labels=labels)
        samples = GaugeMetricFamily("spillover_quality_samples", "Successes + failures seen", labels=labels)
        used = GaugeMetricFamily("spillover_quality_used", "1 once the scorer uses the learned quality", labels=labels)
        for target, buckets in self._book.view()["targets"].items():
            for bucket, stats in buckets.items():
                estimate.add_metric([target, bucket], stats["estimate"])
                samples.add_metric([target, bucket], stats["samples"])
                used.add_metric([target, bucket], 1.0 if stats["used"] else 0.0)
        yield from (estimate, samples, used)


class Learning:
    def __init__(
        self,
        quality: QualityBook | None,
        feedback: FeedbackStore,
        typer: RequestTyper | None = None,
        *,
        clock: Callable[[], float] = time.time,
        per_tenant_per_minute: float = 60.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.quality = quality
        self.feedback = feedback
        self.typer = typer
        self._clock = clock
        self._rate = per_tenant_per_minute
        self._monotonic = monotonic
        self._buckets: dict[str, TokenBucket] = {}  # one per tenant that posted (tenants are configured)
        # what this replica learnt, for the others (serve_apps/learning/pooled_evidence.py)
        self.on_recorded: list[Callable[[DecisionRecord], None]] = []
        self.on_feedback: list[Callable[[FeedbackEvidence], None]] = []

    @classmethod
    def from_config(
        cls,
        config: SpilloverConfig,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        registry: Registry | None = None,
    ) -> Learning:
        section = config.learning.feedback
        store = FeedbackStore(section.max_entries)
        return cls(
            quality_book_for(config, registry),
            store,
            typer_for(config),
            clock=clock,
            per_tenant_per_minute=section.per_tenant_per_minute,
            monotonic=monotonic,
        )

    def admit_feedback(self, owner: str) -> None:
        """Take one of `owner`'s feedback tokens; raises FeedbackRateLimited when it has none left."""
        bucket = self._buckets.get(owner)
        if bucket is None:
            bucket = self._buckets[owner] = TokenBucket(self._rate, clock=self._monotonic)
        wait = bucket.take()
        if wait is not None:
            raise FeedbackRateLimited(
                f"over {self._rate:g} feedback reports per minute (learning.feedback.per_tenant_per_minute)",
                retry_after_s=wait,
            )

    def observer(self, inner: DispatchObserver) -> DispatchObserver:
        return inner if self.quality is None else LearningObserver(inner, self.quality, self.on_recorded)

    def derive(
        self,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        policy: Policy,
        tenant: TenantPolicy | None,
        request_id: str,
    ) -> RequestContract:
        """The request's contract; without a declared scenario, typed first when typing is on."""
        if self.typer is None or any(k.lower() == hdr.SCENARIO for k in headers):
            return derive_contract(body, headers, policy)
        typed = self.typer.type(last_user_text(body), tenant.name if tenant else None, request_id)
        given = dict(headers)
        if typed.scenario is not None:
            given[hdr.SCENARIO] = typed.scenario
        contract = derive_contract(body, given, policy)
        return replace(contract, typing=typed.to_dict())

    def report(self, given: FeedbackInput, record: DecisionRecord, owner: str, *, shared: bool) -> dict[str, Any]:
        """Store a feedback report on `record` (the caller checked it is `owner`'s) and apply it: to
        `owner`'s requests only, or to every tenant's when `shared`."""
        self.feedback.add(Feedback(given.request_id, owner, given.outcome, given.source, given.label, self._clock()))
        success = given.outcome == "success"
        quality = self.quality is not None and self.quality.feedback(record, success, owner, shared=shared)
        target = answered_by(record)
        if quality and target is not None:
            for hook in self.on_feedback:
                hook(FeedbackEvidence(target, bucket_key(record.contract), success, owner, shared))
        typing = (
            given.label is not None
            and self.typer is not None
            and self.typer.learn(given.request_id, given.label, owner, shared=shared)
        )
        return {"quality": quality, "typing": typing}
