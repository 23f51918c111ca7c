"""The shared store: where state that every gateway replica must see alike lives (docs/architecture.md,
"Cross-request state").

    store.py        SharedStore: the atomic operations (values with a TTL, windows, leases, durable sums)
    memory.py       MemoryStore: the in-process store, the embedded default with one gateway replica
    redis_store.py  RedisStore: the same operations on a Redis server (`state.url`), one round trip each
    fallback.py     FallbackStore: Redis while it answers, the replica's own MemoryStore while it does not
    settings.py     the store the config asks for, built once per gateway replica
    local_redis.py  LocalRedis: a loopback redis-server that `spillover serve` and the tests start
    writes.py       BackgroundWrites: writes off the request path (a failed one is counted, never raised)
    timing.py       StoreTime: what the store added to one request's path (its Server-Timing entry)
"""

# The modules of this wing the rest of serve_apps/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("store", "memory", "fallback", "settings", "local_redis", "redis_store", "writes", "timing")
