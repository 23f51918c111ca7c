"""Which replica of a local model takes a request: prefix affinity, minus saturated replicas.

With several replicas of one model the prefix cache only pays off when requests that share a long
prefix land on the replica that already holds it. `PrefixAffinityRouter` (a Ray Serve
`RequestRouter`) keys each request by the first `prefix_chars` characters of its prompt (the
system prompt and the first turns, where sharing happens) and ranks the replicas by rendezvous
hashing of that key: every gateway replica, with no shared state and no extra call, sends the
same prefix to the same model replica, and when a replica leaves only its keys move.

Balanced against load and saturation:
* replicas whose own engine says they are saturated are left out, unless every one is: each
  replica answers Serve's `record_routing_stats` hook (`SpilloverLLMServer`, every
  ROUTING_STATS_PERIOD_S) with `routing_stats` of its latest reading, the saturation of
  router/routing/saturation.py against its model's watermarks, computed there once per period; a request
  only compares that number with 1;
* when the preferred replica's queue is longer than the shortest by more than
  `imbalanced_threshold`, the two shortest-queued of two random picks win (power of two);
* the ranking is returned whole, so Serve falls back to the next replica if the first is full.

Ray's own `PrefixCacheAffinityRouter` (a prefix tree in a separate actor, called with a blocking
`ray.get` per request) was measured first: same hit rate here, but ~4 ms more per request on the
gateway's event loop (bench/reports/cpu-qwen-affinity/report.md).

Per model: `models[].replica_router: power_of_two | prefix_affinity` (serve_apps/engine/llm.py).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from typing import Any

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter

from router.routing.saturation import load
from router.routing.snapshot import ReplicaStats
from router.routing.watermarks import Watermarks

ROUTER_PATH = "serve_apps.engine.replica_router:PrefixAffinityRouter"
ROUTING_STATS_PERIOD_S = 1.0
DEFAULT_PREFIX_CHARS = 2000


def routing_stats(reading: ReplicaStats, watermarks: Watermarks) -> dict[str, Any]:
    """What a replica answers Serve's routing-stats hook with: its reading's saturation (the
    gateway computes the same from the same reading, router/routing/saturation.py `load`)."""
    saturation = load(reading, watermarks)
    return {"saturation": saturation.value, "saturation_term": saturation.term, "read_at": reading.read_at}


def saturated(stats: Mapping[str, Any]) -> bool:
    """A replica's last routing stats say it is saturated (no stats yet: not saturated)."""
    return float(stats.get("saturation", 0.0)) >= 1.0


def unsaturated(replicas: Sequence[Any]) -> list[Any]:
    """The replicas with room, or all of them when none has room."""
    free = [r for r in replicas if not saturated(r.routing_stats)]
    return free or list(replicas)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text(v) for v in value)
    if isinstance(value, dict):
        return _text(value.get("content") if "content" in value else value.get("text"))
    return _text(getattr(value, "content", None) or getattr(value, "text", None))


def prefix_key(args: Sequence[Any], prefix_chars: int) -> str | None:
    """The first `prefix_chars` characters of a chat request's messages or a completion's prompt."""
    for arg in args:
        source = getattr(arg, "messages", None)
        if source is None:
            source = getattr(arg, "prompt", None)
        if source is not None:
            parts = [_text(m) for m in source] if isinstance(source, list) else [_text(source)]
            text = "\n".join(parts)
            return text[:prefix_chars] if text else None
    return None


def rendezvous(key: str, replica_ids: Sequence[str]) -> list[str]:
    """Highest-random-weight order of `replica_ids` for `key` (stable across processes)."""

    def weight(replica: str) -> bytes:
        return hashlib.blake2b(f"{key}\x00{replica}".encode(), digest_size=8).digest()

    return sorted(replica_ids, key=weight, reverse=True)


class PrefixAffinityRouter(PowerOfTwoChoicesRequestRouter):
    def initialize_state(  # type: ignore[override]  # Serve passes request_router_kwargs as these keywords
        self,
        imbalanced_threshold: float = 4,
        prefix_chars: int = DEFAULT_PREFIX_CHARS,
    ) -> None:
        self._imbalanced_threshold = imbalanced_threshold
        self._prefix_chars = prefix_chars

    async def choose_replicas(self, candidate_replicas: list[Any], pending_request: Any = None) -> list[list[Any]]:
        replicas = unsaturated(candidate_replicas)
        if not replicas:
            return []
        key = prefix_key(pending_request.args or (), self._prefix_chars) if pending_request is not None else None
        queue_len = {r.replica_id: self._replica_queue_len_cache.get(r.replica_id) for r in replicas}
        if key is not None and len(replicas) > 1:
            by_id = {r.replica_id.unique_id: r for r in replicas}
            ordered = [by_id[i] for i in rendezvous(key, list(by_id))]
            first, rest = queue_len[ordered[0].replica_id], [queue_len[r.replica_id] for r in ordered[1:]]
            known = [q for q in rest if q is not None]
            if first is None or not known or first - min(known) <= self._imbalanced_threshold:
                return [[ordered[0]], ordered[1:]]
        picks = random.sample(replicas, k=min(2, len(replicas)))
        return [sorted(picks, key=lambda r: queue_len[r.replica_id] or 0)]
