"""Gateway metrics, served at `GET /metrics` in the Prometheus text format.

Each gateway owns its own `CollectorRegistry` (no process-global default registry), so several
gateways in one process — or tests — never share counters. With N gateway replicas and a shared store,
serve_apps/telemetry/replica_metrics.py makes any replica's `/metrics` answer with every replica's series
(label `gateway_replica`); the dashboard sums them.

    spillover_requests_total{model,route,target,outcome}     answered requests (outcome: ok or error code)
    spillover_routing_decision_seconds                       contract pipeline + burst decision time
    spillover_admission_queue_length{model}                  requests waiting for local room
    spillover_admission_wait_seconds{model,outcome}          time waited (outcome: local|cloud|timeout|rejected)
    spillover_replica_saturation{model,replica}              router/routing/saturation.py value (stale = +Inf)
    spillover_replica_kv_cache_usage{model,replica}          engine KV usage 0..1
    spillover_replica_gpu_memory_pressure{model,replica,gpu} router/routing/saturation.py GPU memory pressure term
    spillover_replica_gpu_memory_bytes{model,replica,gpu,owner}  NVML used memory, owner engine | others
    spillover_replica_gpu_utilization{model,replica,gpu}     SM utilisation, percent (NVML)
    spillover_tokens_total{target,kind}                      prompt / completion tokens by target
    spillover_cost_usd_total{target}                         cost by target, failed attempts included
    spillover_attempts_total{target,outcome}                 attempts (ok, error, skipped, contract_violation, cut,
                                                             cancelled); a stream's when it ends, with what it consumed
    spillover_contract_flagged_total{target}                 answers passed (L2) although they broke their output
                                                             contract (JSON schema, tool arguments; streamed or not)
    spillover_stream_repairs_total{target,kind}              streams repaired: skipped_event (a malformed event
                                                             skipped), done_missing (no [DONE] after a
                                                             finish_reason), continued (spliced onto another
                                                             target), not_continued (a break nobody could continue)
    spillover_target_health{target}                          0 green, 1 yellow, 2 red, 3 black
    spillover_target_share{target}                           share of new requests the target takes now
    spillover_health_transitions_total{target,to}            health transitions (ramp steps, half-open included)
    spillover_health_disagreement{target}                    1 while a level's latest probe contradicts live traffic
    spillover_probes_overruled_total{target}                 probes outranked by contradicting live outcomes
    spillover_probe_rejections_total{target}                 probes the target refused as a client error (no evidence)
    spillover_breaker_open{breaker}                          1 while a target / domain breaker is not closed
    spillover_retry_budget_tokens                            retries the gateway-wide budget allows now
    spillover_spend_ledger_failures_total{op}                spend ledger writes (incl. dropped) / reads that failed
    spillover_decision_log_failures_total{reason}            decision log lines lost (reason: write | dropped)
    spillover_learning_evidence_total{kind}                  pooled learning evidence (serve_apps/learning/
                                                             pooled_evidence.py): sent, applied, rejected, stale,
                                                             dropped
    spillover_session_switches_total{model,from,to,why}      sessions moved off their pinned target (docs/sessions.md)
    spillover_session_tokens_saved_total{model}              prompt tokens saved by compressing a session's history
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from router.learning.decision import DecisionRecord
from router.routing.saturation import assessed_at
from router.routing.snapshot import ClusterSnapshot
from serve_apps.state.fallback import StoreView

PREFIX = "spillover_"
HEALTH_LEVELS = {"green": 0, "yellow": 1, "red": 2, "black": 3}
ResilienceView = Mapping[str, Any]


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "spillover_requests", "Answered requests", ["model", "route", "target", "outcome"], registry=r
        )
        self.decision_seconds = Histogram(
            "spillover_routing_decision_seconds",
            "Contract pipeline + burst decision time",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1),
            registry=r,
        )
        self.queue_length = Gauge(
            "spillover_admission_queue_length", "Requests waiting for local room", ["model"], registry=r
        )
        self.wait_seconds = Histogram(
            "spillover_admission_wait_seconds",
            "Time spent waiting for local room",
            ["model", "outcome"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.saturation = Gauge(
            "spillover_replica_saturation", "Replica saturation (>= 1 saturated)", ["model", "replica"], registry=r
        )
        self.kv_usage = Gauge("spillover_replica_kv_cache_usage", "Engine KV usage", ["model", "replica"], registry=r)
        gpu_labels = ["model", "replica", "gpu"]
        self.gpu_pressure = Gauge(
            "spillover_replica_gpu_memory_pressure",
            "GPU memory pressure (1 = free at the floor)",
            gpu_labels,
            registry=r,
        )
        self.gpu_bytes = Gauge(
            "spillover_replica_gpu_memory_bytes", "GPU memory by owner", [*gpu_labels, "owner"], registry=r
        )
        self.gpu_utilization = Gauge(
            "spillover_replica_gpu_utilization", "GPU SM utilisation, percent", gpu_labels, registry=r
        )
        self.tokens = Counter("spillover_tokens", "Tokens by target", ["target", "kind"], registry=r)
        self.cost = Counter("spillover_cost_usd", "Cost by target (failed attempts included)", ["target"], registry=r)
        self.attempts = Counter(
            "spillover_attempts", "Attempts by target and outcome", ["target", "outcome"], registry=r
        )
        self.contract_flagged = Counter(
            "spillover_contract_flagged",
            "Answers passed (L2) with an output-contract violation",
            ["target"],
            registry=r,
        )
        self.stream_repairs = Counter(
            "spillover_stream_repairs", "Streams repaired or not continued", ["target", "kind"], registry=r
        )
        self.health = Gauge("spillover_target_health", "0 green, 1 yellow, 2 red, 3 black", ["target"], registry=r)
        self.share = Gauge("spillover_target_share", "Share of new requests the target takes", ["target"], registry=r)
        self.transitions = Counter("spillover_health_transitions", "Health transitions", ["target", "to"], registry=r)
        self.disagreement = Gauge(
            "spillover_health_disagreement",
            "1 while probes contradict live traffic (live decides)",
            ["target"],
            registry=r,
        )
        self.overruled = Counter(
            "spillover_probes_overruled", "Probes outranked by contradicting live outcomes", ["target"], registry=r
        )
        self.rejections = Counter(
            "spillover_probe_rejections", "Probes refused as a client error (no evidence)", ["target"], registry=r
        )
        self._evidence_seen: dict[tuple[str, str], int] = {}
        self.breaker_open = Gauge("spillover_breaker_open", "1 while not closed", ["breaker"], registry=r)
        self.retry_budget = Gauge("spillover_retry_budget_tokens", "Retries the budget allows now", registry=r)
        self._transitions_seen: dict[str, int] = {}
        self.ledger_failures = Counter(
            "spillover_spend_ledger_failures", "Spend ledger failures (op: write, read)", ["op"], registry=r
        )
        self._ledger_seen: dict[str, int] = {"write": 0, "read": 0}
        self.decision_log_failures = Counter(
            "spillover_decision_log_failures",
            "Decision log lines lost (reason: write, dropped)",
            ["reason"],
            registry=r,
        )
        self._log_seen: dict[str, int] = {"write": 0, "dropped": 0}
        self.learning_evidence = Counter(
            "spillover_learning_evidence",
            "Pooled learning evidence entries (kind: sent, applied, rejected, stale, dropped)",
            ["kind"],
            registry=r,
        )
        self._pool_seen: dict[str, int] = {}
        self.session_switches = Counter(
            "spillover_session_switches",
            "Sessions moved off their pinned target",
            ["model", "from", "to", "why"],
            registry=r,
        )
        self.session_saved = Counter(
            "spillover_session_tokens_saved", "Prompt tokens saved by compressing history", ["model"], registry=r
        )
        self.store_up = Gauge(
            "spillover_state_store_up", "1 while the shared store (state.url) answers, 0 while down", registry=r
        )
        self.store_outages = Counter(
            "spillover_state_store_outages", "Times the shared store stopped answering", registry=r
        )

    # DispatchObserver
    def waiting(self, model: str, count: int) -> None:
        self.queue_length.labels(model).set(count)

    def waited(self, model: str, seconds: float, outcome: str) -> None:
        self.wait_seconds.labels(model, outcome).observe(seconds)

    def decided(self, seconds: float) -> None:
        self.decision_seconds.observe(seconds)

    def answered(self, model: str, route: str, target: str, outcome: str) -> None:
        self.requests.labels(model, route or "none", target or "none", outcome).inc()

    def recorded(self, record: DecisionRecord) -> None:
        for attempt in record.attempts:
            self.tokens.labels(attempt.target, "prompt").inc(attempt.prompt_tokens)
            self.tokens.labels(attempt.target, "completion").inc(attempt.completion_tokens)
            if attempt.cost_usd:
                self.cost.labels(attempt.target).inc(attempt.cost_usd)
            self.attempts.labels(attempt.target, attempt.outcome).inc()
            if attempt.contract and attempt.contract != "repaired":
                self.contract_flagged.labels(attempt.target).inc()
        if record.session:
            self._session(str(record.contract.get("model", "")), record.session)

    def _session(self, model: str, session: Mapping[str, Any]) -> None:
        if (switch := session.get("switch")) is not None:
            self.session_switches.labels(
                model, switch["from"] or "", switch["to"] or "pending", switch["why"] or ""
            ).inc()
        for prepared in session.get("prepared", ()):
            if "compression" in prepared and prepared["target"] == session.get("target"):
                self.session_saved.labels(model).inc(max(0, prepared["compression"]["tokens_saved"]))

    def stream_repaired(self, target: str, kind: str) -> None:
        self.stream_repairs.labels(target, kind).inc()

    def resilience(self, view: ResilienceView) -> None:
        """Health, breakers and budget from `Resilience.view()` (called on every telemetry refresh)."""
        for target, health in view["health"].items():
            self.health.labels(target).set(HEALTH_LEVELS.get(health["state"], 3))
            self.share.labels(target).set(health["share"])
            total = health["transitions_total"]
            seen = min(self._transitions_seen.get(target, 0), total)  # a reset machine counts from 0
            for transition in health["transitions"][-(total - seen) :] if total > seen else []:
                self.transitions.labels(target, transition["to"]).inc()
            self._transitions_seen[target] = total
            self.disagreement.labels(target).set(1 if health.get("disagreement") else 0)
            for counter, field in (
                (self.overruled, "probes_overruled_total"),
                (self.rejections, "probe_rejections_total"),
            ):
                now_total, key = health.get(field, 0), (target, field)
                counter.labels(target).inc(max(0, now_total - min(self._evidence_seen.get(key, 0), now_total)))
                self._evidence_seen[key] = now_total
        for breaker, state in view["breakers"].items():
            self.breaker_open.labels(breaker).set(0 if state == "closed" else 1)
        self.retry_budget.set(view["retry_budget"])
        for op in ("write", "read"):
            total = (view.get("spend_ledger") or {}).get(f"{op}_failures", 0)
            _count_up(self.ledger_failures, op, total, self._ledger_seen)

    def state_store(self, view: StoreView) -> None:
        """The shared store went down or came back (serve_apps/state/fallback.py)."""
        self.store_up.set(1 if view.up else 0)
        if not view.up:
            self.store_outages.inc()

    def decision_log(self, *, failed: int, dropped: int) -> None:
        """The decision log writer's running totals (serve_apps/off_loop/background_writer.py)."""
        for reason, total in (("write", failed), ("dropped", dropped)):
            _count_up(self.decision_log_failures, reason, total, self._log_seen)

    def learning_pool(self, totals: Mapping[str, int]) -> None:
        """The evidence pool's running totals per kind (serve_apps/learning/pooled_evidence.py `PoolCounts`)."""
        for kind, total in totals.items():
            _count_up(self.learning_evidence, kind, total, self._pool_seen)

    def replicas(self, snapshot: ClusterSnapshot, now: float) -> None:
        """The replicas' gauges from `snapshot` and the saturations it carries (router/routing/saturation.py
        `assess`: the values the router decides with), stale ones at `now` as +Inf."""
        for replica in snapshot.replicas:
            self.kv_usage.labels(replica.model, replica.replica_id).set(replica.kv_cache_usage)
            sat = assessed_at(replica, snapshot, now)
            if sat is None:
                continue
            self.saturation.labels(replica.model, replica.replica_id).set(sat.value)
            pressures = snapshot.saturations[replica.replica_id].gpu_pressures
            for gpu, pressure in zip(replica.gpus, pressures, strict=False):
                labels = (replica.model, replica.replica_id, str(gpu.index))
                self.gpu_pressure.labels(*labels).set(pressure)
                self.gpu_bytes.labels(*labels, "engine").set(gpu.engine_bytes)
                self.gpu_bytes.labels(*labels, "others").set(gpu.other_bytes)
                if gpu.utilization_gpu is not None:
                    self.gpu_utilization.labels(*labels).set(gpu.utilization_gpu)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _count_up(counter: Counter, label: str, total: int, seen: dict[str, int]) -> None:
    """Add to `counter{label}` what a running total (which never goes back) gained since `seen` last noted it."""
    before = seen.get(label, 0)
    counter.labels(label).inc(max(0, total - before))
    seen[label] = max(total, before)
