"""Which replica of a local model takes a request (issue 9): prefix affinity, minus saturated replicas.

With several replicas of one model the prefix cache only pays off when requests that share a long
prefix land on the replica that already holds it. Ray's `PrefixCacheAffinityRouter` does that (a
prefix tree of what each replica was sent; the best match wins while queue lengths stay within
`imbalanced_threshold`, else power-of-two). It knows queue lengths but not engine pressure, so
`SaturationAwarePrefixRouter` first drops the replicas whose own engine says they are saturated —
`record_routing_stats` of `SpilloverLLMServer` reports KV usage, waiting requests and GPU memory,
judged against the model's watermarks with the same terms as router/saturation.py — and lets
Ray's router choose among the rest (among all of them when every one is saturated: the gateway's
admission and burst decide whether the request runs locally at all).

Per model: `models[].replica_router: power_of_two | prefix_affinity` (serve_apps/llm.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray.serve.llm.request_router import PrefixCacheAffinityRouter

ROUTER_PATH = "serve_apps.replica_router:SaturationAwarePrefixRouter"
ROUTING_STATS_PERIOD_S = 1.0


def saturated(stats: Mapping[str, Any], *, kv_cache: float, gpu_memory: float, queue: int) -> bool:
    """The replica's own last reading, against its model's watermarks (empty stats: not saturated)."""
    if not stats:
        return False
    return (
        float(stats.get("kv_cache_usage", 0.0)) >= kv_cache
        or float(stats.get("gpu_memory_fraction", 0.0)) >= gpu_memory
        or int(stats.get("num_waiting", 0)) >= queue
    )


def unsaturated(replicas: list[Any], *, kv_cache: float, gpu_memory: float, queue: int) -> list[Any]:
    """The replicas with room, or all of them when none has room."""
    free = [
        r for r in replicas if not saturated(r.routing_stats, kv_cache=kv_cache, gpu_memory=gpu_memory, queue=queue)
    ]
    return free or replicas


class SaturationAwarePrefixRouter(PrefixCacheAffinityRouter):
    def initialize_state(
        self, kv_cache: float = 0.85, gpu_memory: float = 0.85, queue: int = 8, **prefix_kwargs: Any
    ) -> None:
        self._watermarks = {"kv_cache": kv_cache, "gpu_memory": gpu_memory, "queue": queue}
        super().initialize_state(**prefix_kwargs)

    async def choose_replicas(self, candidate_replicas: list[Any], pending_request: Any = None) -> list[Any]:
        return await super().choose_replicas(unsaturated(candidate_replicas, **self._watermarks), pending_request)
