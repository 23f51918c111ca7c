"""The store the config asks for, built once per gateway replica.

No `state.url`: the replica's own MemoryStore (one gateway replica). A Redis URL: a FallbackStore over a
RedisStore, with this replica's MemoryStore for when Redis does not answer. `state.url: local` is replaced
by the loopback server's address before the replicas are built (serve_apps/runner.py starts it), so a
replica that still sees it was started some other way: a ConfigError says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from cluster.config.gateway import LOCAL, StateSection
from router.errors import ConfigError
from serve_apps.state.fallback import FallbackStore, StoreView
from serve_apps.state.memory import MemoryStore
from serve_apps.state.redis_store import RedisStore
from serve_apps.state.store import SharedStore


def shared_store(
    section: StateSection,
    environ: Mapping[str, str],
    *,
    clock: Callable[[], float] = time.monotonic,
    on_change: Callable[[StoreView], None] | None = None,
) -> SharedStore:
    local = MemoryStore(clock=clock)
    if section.url is None:
        return local
    if section.url == LOCAL:
        raise ConfigError(
            "state.url",
            [("state.url", "'local' is resolved by `spillover serve`, which starts the loopback Redis: serve with it")],
        )
    password = environ.get(section.password_env) or None
    primary = RedisStore(section.url, password=password, timeout_s=section.timeout_s)
    return FallbackStore(primary, local, retry_s=section.retry_s, on_change=on_change)


def store_view(store: SharedStore) -> StoreView | None:
    """What /readyz shows of the store: None for a replica's own memory (nothing to reach)."""
    return store.view() if isinstance(store, FallbackStore) else None
