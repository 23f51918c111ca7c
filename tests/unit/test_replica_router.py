"""Replica choice: saturated replicas are left out before Ray's prefix-affinity router chooses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cluster.config.deployment import parse_config
from router.routing.snapshot import GpuMemory, ReplicaStats
from router.routing.watermarks import Watermarks
from serve_apps.engine.llm import llm_config_for, watermarks_of
from serve_apps.engine.replica_router import ROUTER_PATH, prefix_key, rendezvous, routing_stats, saturated, unsaturated

MARKS = Watermarks(kv_cache=0.85, gpu_memory=0.95, queue=8)
GIB = 1024**3


@dataclass
class Replica:
    name: str
    routing_stats: dict[str, Any] = field(default_factory=dict)


def reading(**fields: Any) -> ReplicaStats:
    """A replica's engine reading, as SpilloverLLMServer takes it every push period."""
    base: dict[str, Any] = dict(
        model="m", replica_id="r", node_id="n", read_at=100.0, kv_cache_usage=0.0, num_running=0, num_waiting=0
    )
    base |= dict(prefix_cache_queries=0, prefix_cache_hits=0, num_gpu_blocks=10, block_size=16)
    return ReplicaStats(**{**base, **fields})


def test_a_replica_is_saturated_by_any_one_term() -> None:
    """The stats a replica answers Serve's routing-stats hook with, as the replica router reads them."""
    assert not saturated({})  # no reading yet: not held against it
    idle_engine = GpuMemory(0, "GPU-0", 72 * GIB, 80 * GIB, engine_bytes=72 * GIB, reserved_bytes=72 * GIB)
    crowded = GpuMemory(0, "GPU-0", 77 * GIB, 80 * GIB, engine_bytes=72 * GIB, reserved_bytes=72 * GIB)
    assert not saturated(routing_stats(reading(kv_cache_usage=0.5, num_waiting=2, gpus=(idle_engine,)), MARKS))
    assert saturated(routing_stats(reading(kv_cache_usage=0.9), MARKS))
    assert saturated(routing_stats(reading(num_waiting=8), MARKS))
    assert saturated(routing_stats(reading(gpus=(crowded,)), MARKS))  # others 5 GiB > the 4 GiB room above the floor
    assert saturated(routing_stats(reading(gpu_error="NVML failed: GPU is lost"), MARKS))
    stats = routing_stats(reading(kv_cache_usage=0.17), Watermarks(kv_cache=0.34, low=0.2))
    assert stats == {"saturation": 0.5, "saturation_term": "kv_cache", "read_at": 100.0}  # the model's own marks


def test_saturated_replicas_are_left_out_unless_all_are() -> None:
    hot, cool = Replica("hot", {"saturation": 1.1}), Replica("cool", {"saturation": 0.1})
    assert [r.name for r in unsaturated([hot, cool])] == ["cool"]
    assert [r.name for r in unsaturated([hot])] == ["hot"]  # the gateway decides about bursting


def config(**model: Any) -> Any:
    return parse_config({"models": [{"alias": "m", "source": "prepared:x", "family": "qwen", **model}]}, "test")


def test_several_replicas_get_our_router_and_the_replicas_their_models_watermarks() -> None:
    spec = config(replicas=2, imbalanced_threshold=3).models[0]
    marks = Watermarks(kv_cache=0.5, queue=4, low=0.4)
    llm = llm_config_for(spec, "/models/m", marks)
    router = llm.deployment_config["request_router_config"]
    assert router["request_router_class"] == ROUTER_PATH
    assert router["request_router_kwargs"] == {"imbalanced_threshold": 3, "prefix_chars": 2000}
    assert watermarks_of(llm.experimental_configs) == marks  # what each replica judges its routing stats by


def test_one_replica_or_power_of_two_keeps_rays_default() -> None:
    for spec in (config().models[0], config(replicas=2, replica_router="power_of_two").models[0]):
        assert "request_router_config" not in llm_config_for(spec, "/models/m").deployment_config


@dataclass
class Message:
    content: Any
    role: str = "user"


@dataclass
class ChatRequest:
    messages: list[Any]


def test_the_prefix_key_is_the_start_of_the_prompt() -> None:
    system = "You are a careful assistant. " * 100
    a = ChatRequest([Message(system, "system"), Message("question one")])
    b = ChatRequest([{"role": "system", "content": system}, {"role": "user", "content": "question two"}])
    assert prefix_key([a], 2000) == prefix_key([b], 2000)  # same system prompt: same key
    assert prefix_key([a], 10_000) != prefix_key([b], 10_000)  # the whole prompt differs
    parts = ChatRequest([Message([{"type": "text", "text": "hello"}, {"type": "text", "text": " world"}])])
    assert prefix_key([parts], 100) == "hello world"
    assert prefix_key([object()], 100) is None


def test_rendezvous_is_stable_spreads_keys_and_moves_only_a_leaving_replicas_keys() -> None:
    replicas = ["r1", "r2", "r3"]
    keys = [f"system prompt {i}" for i in range(300)]
    first = {k: rendezvous(k, replicas)[0] for k in keys}
    assert first == {k: rendezvous(k, list(reversed(replicas)))[0] for k in keys}  # order-independent
    counts = {r: list(first.values()).count(r) for r in replicas}
    assert min(counts.values()) > 60  # roughly even (100 each expected)
    after = {k: rendezvous(k, ["r1", "r3"])[0] for k in keys}
    assert all(after[k] == first[k] for k in keys if first[k] != "r2")  # only r2's keys moved


@dataclass(frozen=True)
class Rid:
    unique_id: str


@dataclass
class Running:
    replica_id: Rid
    routing_stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class Pending:
    args: tuple[Any, ...]


class Lens(dict):  # the router's queue-length cache answers .get(replica_id)
    pass


async def test_choose_replicas_prefers_the_prefix_owner_unless_saturated_or_imbalanced() -> None:
    from serve_apps.engine.replica_router import PrefixAffinityRouter

    router = PrefixAffinityRouter.__new__(PrefixAffinityRouter)  # no Serve controller needed
    router.initialize_state(imbalanced_threshold=2)
    replicas = [Running(Rid(f"r{i}")) for i in range(3)]
    router._replica_queue_len_cache = Lens()  # type: ignore[attr-defined]
    request = Pending((ChatRequest([Message("shared system prompt " * 50), Message("q")]),))
    owner_id = rendezvous(prefix_key(request.args, 2000) or "", [r.replica_id.unique_id for r in replicas])[0]
    ranks = await router.choose_replicas(replicas, request)
    assert ranks[0][0].replica_id.unique_id == owner_id and len(ranks[1]) == 2  # owner first, the rest as fallback

    owner = next(r for r in replicas if r.replica_id.unique_id == owner_id)
    owner.routing_stats = {"saturation": 1.16}  # saturated: left out
    ranks = await router.choose_replicas(replicas, request)
    assert owner not in [r for rank in ranks for r in rank]

    owner.routing_stats = {}
    router._replica_queue_len_cache = Lens({r.replica_id: (9 if r is owner else 1) for r in replicas})  # type: ignore[attr-defined]
    ranks = await router.choose_replicas(replicas, request)
    assert len(ranks) == 1 and ranks[0][0] is not owner  # imbalanced: power of two, shorter queue first


def test_a_cpu_engine_bounds_onednns_primitive_cache_unless_the_operator_set_it(monkeypatch: Any) -> None:
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    spec = config(accelerator="cpu").models[0]
    assert llm_config_for(spec, "/models/m").runtime_env["env_vars"]["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "64"
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "512")
    assert llm_config_for(spec, "/models/m").runtime_env["env_vars"]["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "512"
