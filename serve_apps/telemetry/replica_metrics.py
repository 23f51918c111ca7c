"""Every gateway replica's metrics through any replica's `GET /metrics`, each replica as its own series.

Serve's proxy sends a scrape of the one gateway address to whichever replica it picks, so a replica that
answered with its own registry alone gave Prometheus a random replica's counters each time. Here each
replica pushes its exposition to the shared store every `period_s` (serve_apps/state/: under
`metrics:replica:<id>`, with a lease on `metrics:replicas` that says it is alive; both expire after three
periods unpushed, so a dead replica's series go with it), and a scrape answers with every live replica's
series, each sample labelled `gateway_replica="<id>"`: its own as it is now, the others' as of their last
push (at most `period_s` old). Counters stay per replica, so `rate()` is right and the dashboard sums them
(`cluster/grafana-dashboard.json`: `sum by (...)`).

While the shared store does not answer, the fallback's memory holds only this replica's push: a scrape then
answers with this replica alone (and `spillover_state_store_up` says 0). A stored exposition that does not
parse (not written by a replica) is skipped, never an error on the scrape.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from serve_apps.state.store import SharedStore

log = logging.getLogger("spillover.metrics")

DIRECTORY = "metrics:replicas"
LABEL = "gateway_replica"
MAX_REPLICAS = 64  # a scrape reads at most this many replicas' pushes


class ReplicaMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        store: SharedStore,
        replica: str,
        *,
        period_s: float = 5.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.registry = registry
        self.store = store
        self.replica = replica
        self.period_s = period_s
        self._sleep = sleep
        self._too_big_said = False

    def _key(self, replica: str) -> str:
        return f"metrics:replica:{replica}"

    async def push(self) -> None:
        """This replica's exposition into the store, and its lease in the directory renewed."""
        ttl_s = 3 * self.period_s
        text = generate_latest(self.registry)
        if not await self.store.put(self._key(self.replica), text, ttl_s) and not self._too_big_said:
            self._too_big_said = True  # past the store's value bound: scrapes of other replicas miss this one
            log.warning("this replica's metrics (%d bytes) are too big for the shared store", len(text))
        await self.store.lease_take(DIRECTORY, self.replica, MAX_REPLICAS * 4, ttl_s)

    async def run(self) -> None:
        """Push every `period_s` (a background loop of the gateway replica)."""
        while True:
            try:
                await self.push()
            except Exception:  # the next period tries again; a scrape still answers
                log.exception("metrics push to the shared store failed")
            await self._sleep(self.period_s)

    async def render(self) -> bytes:
        """Every live replica's series, labelled by replica; this replica's own read now."""
        texts = {self.replica: generate_latest(self.registry)}
        for replica in await self.store.lease_holders(DIRECTORY, MAX_REPLICAS):
            if replica != self.replica:
                pushed = await self.store.get(self._key(replica))
                if pushed is not None:
                    texts[replica] = pushed
        return render_labelled(texts)


def render_labelled(texts: dict[str, bytes]) -> bytes:
    """One exposition of several replicas' expositions, each sample labelled with its replica."""
    families: dict[str, Metric] = {}
    for replica, text in texts.items():
        try:
            parsed = list(_families(text))
        except (ValueError, UnicodeDecodeError, IndexError, TypeError):
            log.warning("skipping replica %r's stored metrics: not an exposition", replica[:64])
            continue
        for family in parsed:
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type)
            elif merged.type != family.type:
                continue  # another replica's code version typed it otherwise: keep the first
            merged.samples.extend(
                Sample(s.name, {**s.labels, LABEL: replica}, s.value, s.timestamp, s.exemplar) for s in family.samples
            )
    merged_registry = CollectorRegistry()
    merged_registry.register(_Families(list(families.values())))
    return generate_latest(merged_registry)


def _families(text: bytes) -> Iterator[Metric]:
    yield from text_string_to_metric_families(text.decode())


class _Families(Collector):
    """A collector over ready families (what `generate_latest` reads from a registry)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families
