"""The shared store on a Redis server (`state.url`): each operation one round trip, atomic on the server.

Windows and leases run on the server's clock (`TIME` inside their Lua scripts), so gateways on nodes whose
clocks differ count the same windows and expire the same leases. Every key is under `spillover:`.

* values: `SET ... PX` (`NX GET` for `put_if_absent`, Redis >= 7), a compare-and-delete script;
* windows: one key per window (`<key>:<window>`), `INCRBYFLOAT` under the limit and an expiry of two
  windows, in one script;
* leases: a sorted set of holder -> expiry (ms), expired members removed by the script that takes one;
  the set itself expires with its last lease, so a gateway that died leaves nothing behind past `ttl_s`;
* durable sums: a hash (`HINCRBYFLOAT` in a MULTI), no TTL: kept as long as the server keeps its data
  (ray-cluster.yaml and `spillover serve` start it with the append-only file on);
* logs: a stream (`XADD ... MAXLEN ~`, one pipelined round trip per batch; `XRANGE` from just after the last
  id read), bounded by its length rather than a TTL.

The client never retries on its own and gives up after `timeout_s` (a connect after at least 1 s): a Redis that
is down or hung costs a request at most that, once (serve_apps/state/fallback.py stops asking it until it
answers a ping again). At most `max_connections` connections per replica: a burst of requests queues for one
(within `timeout_s`) instead of opening a connection each.
Any failure to get an answer is `StoreUnavailable`, with the URL's password never in its text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from router.errors import StoreUnavailable
from serve_apps.state.store import DEFAULT_MAX_VALUE_BYTES, WindowCount

PREFIX = "spillover:"
_STREAM_ID = re.compile(r"\d{1,20}-\d{1,20}")  # an id XADD gave
_BIG = 1e300  # a limit of math.inf: Lua's tonumber does not read "inf"

_WINDOW_ADD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local span = tonumber(ARGV[3])
local w = math.floor(now / span)
local k = KEYS[1] .. ':' .. w
local used = tonumber(redis.call('GET', k) or '0')
if used + tonumber(ARGV[1]) > tonumber(ARGV[2]) then
  return {0, tostring(used), w, tostring((w + 1) * span - now)}
end
local v = redis.call('INCRBYFLOAT', k, ARGV[1])
redis.call('PEXPIRE', k, math.ceil(span * 2000))
return {1, v, w, '0'}
"""

_WINDOW_ADJUST = """
local k = KEYS[1] .. ':' .. ARGV[1]
if redis.call('EXISTS', k) == 0 then return 0 end
local v = tonumber(redis.call('INCRBYFLOAT', k, ARGV[2]))
if v < 0 then redis.call('SET', k, '0', 'KEEPTTL') end
return 1
"""

_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_KEEP_WHILE_LEASED = """
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then redis.call('PEXPIREAT', KEYS[1], math.ceil(tonumber(last[2]))) end
"""

_LEASE_TAKE = (
    _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
local n = redis.call('ZCARD', KEYS[1])
if (not held) and n >= tonumber(ARGV[2]) then return -1 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
"""
    + _KEEP_WHILE_LEASED
    + """
if held then return n end
return n + 1
"""
)

_LEASE_RENEW = (
    _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i]) end
"""
    + _KEEP_WHILE_LEASED
)

_LEASE_COUNT = (
    _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""
)

_LEASE_HOLDERS = (
    _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
"""
)

_DELETE_IF = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

T = TypeVar("T")


def redacted(url: str) -> str:
    """The URL without a password, for messages and logs."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    auth, _, host = rest.rpartition("@")
    user = auth.split(":", 1)[0]
    return f"{scheme}://{user + '@' if user else ''}{host}"


class RedisStore:
    kind = "redis"

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        timeout_s: float = 0.5,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        max_connections: int = 16,
    ) -> None:
        self.url = redacted(url)
        self.max_value_bytes = max_value_bytes
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout_s,  # waiting for a free connection counts as the operation's wait
            password=password,
            socket_timeout=timeout_s,
            # a TCP connect is slower than an answer on a loaded machine; a refused one is instant anyway
            socket_connect_timeout=max(1.0, 4 * timeout_s),
            retry=Retry(NoBackoff(), 0),
            decode_responses=False,
        )
        self._redis: aioredis.Redis = aioredis.Redis(connection_pool=pool)
        self._window_add = self._redis.register_script(_WINDOW_ADD)
        self._window_adjust = self._redis.register_script(_WINDOW_ADJUST)
        self._lease_take = self._redis.register_script(_LEASE_TAKE)
        self._lease_renew = self._redis.register_script(_LEASE_RENEW)
        self._lease_count = self._redis.register_script(_LEASE_COUNT)
        self._lease_holders = self._redis.register_script(_LEASE_HOLDERS)
        self._delete_if = self._redis.register_script(_DELETE_IF)

    async def _call(self, what: str, pending: Awaitable[T]) -> T:
        try:
            return await pending
        except (RedisError, OSError) as exc:
            if isinstance(exc, (RedisConnectionError, OSError)):
                # the server went away: its idle connections in the pool are dead too. Dropped now, so that once
                # it is back each operation opens a fresh one, rather than every stale one failing once (each
                # failure turning the fallback down again, for up to 16 operations after a restart)
                try:
                    await self._redis.connection_pool.disconnect(inuse_connections=False)
                except (RedisError, OSError):
                    pass
            raise StoreUnavailable(f"redis at {self.url} ({what}): {type(exc).__name__}: {exc}") from None

    async def get(self, key: str) -> bytes | None:
        value = await self._call("get", self._redis.get(PREFIX + key))
        return value.encode() if isinstance(value, str) else value

    async def put(self, key: str, value: bytes, ttl_s: float) -> bool:
        if len(value) > self.max_value_bytes:
            return False
        await self._call("put", self._redis.set(PREFIX + key, value, px=_ms(ttl_s)))
        return True

    async def put_if_absent(self, key: str, value: bytes, ttl_s: float) -> bytes | None:
        if len(value) > self.max_value_bytes:
            raise ValueError(f"a value of {len(value)} bytes is over the store's {self.max_value_bytes}")
        held = await self._call("put_if_absent", self._redis.set(PREFIX + key, value, px=_ms(ttl_s), nx=True, get=True))
        return held if isinstance(held, bytes) else None

    async def delete(self, key: str, *, if_value: bytes | None = None) -> bool:
        if if_value is None:
            removed = await self._call("delete", self._redis.delete(PREFIX + key))
        else:
            removed = await self._call("delete", self._delete_if(keys=[PREFIX + key], args=[if_value]))
        return bool(removed)

    async def window_add(self, key: str, amount: float, limit: float, window_s: float) -> WindowCount:
        args = [repr(float(amount)), repr(min(float(limit), _BIG)), repr(float(window_s))]
        reply: list[Any] = await self._call("window_add", self._window_add(keys=[PREFIX + key], args=args))
        allowed, used, window, retry_in = reply
        return WindowCount(bool(allowed), float(used), int(window), retry_in_s=max(0.0, float(retry_in)))

    async def window_adjust(self, key: str, window: int, delta: float, window_s: float) -> None:
        await self._call("window_adjust", self._window_adjust(keys=[PREFIX + key], args=[window, repr(float(delta))]))

    async def lease_take(self, key: str, holder: str, limit: int, ttl_s: float) -> int | None:
        held = await self._call("lease_take", self._lease_take(keys=[PREFIX + key], args=[holder, limit, _ms(ttl_s)]))
        return None if int(held) < 0 else int(held)

    async def lease_renew(self, key: str, holders: Sequence[str], ttl_s: float) -> None:
        if holders:
            await self._call("lease_renew", self._lease_renew(keys=[PREFIX + key], args=[_ms(ttl_s), *holders]))

    async def lease_drop(self, key: str, holder: str) -> None:
        await self._call("lease_drop", self._redis.zrem(PREFIX + key, holder))

    async def lease_count(self, key: str) -> int:
        return int(await self._call("lease_count", self._lease_count(keys=[PREFIX + key], args=[])))

    async def lease_holders(self, key: str, limit: int = 256) -> list[str]:
        held = await self._call("lease_holders", self._lease_holders(keys=[PREFIX + key], args=[max(1, limit)]))
        return [h.decode() if isinstance(h, bytes) else str(h) for h in held]

    async def add_amounts(self, key: str, amounts: Mapping[str, float]) -> None:
        if not amounts:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            for name, amount in amounts.items():
                pipe.hincrbyfloat(PREFIX + key, name, amount)
            await self._call("add_amounts", pipe.execute())

    async def amounts(self, key: str) -> dict[str, float]:
        raw = await self._call("amounts", self._redis.hgetall(PREFIX + key))
        return {(name.decode() if isinstance(name, bytes) else name): float(value) for name, value in raw.items()}

    async def log_append(self, key: str, values: Sequence[bytes], max_len: int) -> None:
        kept = [v for v in values if len(v) <= self.max_value_bytes]
        if not kept:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for value in kept:
                pipe.xadd(PREFIX + key, {"v": value}, maxlen=max(1, max_len), approximate=True)
            await self._call("log_append", pipe.execute())

    async def log_after(self, key: str, after: str | None, count: int) -> list[tuple[str, bytes]]:
        if count < 1:
            return []
        start = "-" if after is None or not _STREAM_ID.fullmatch(after) else f"({after}"
        raw = await self._call("log_after", self._redis.xrange(PREFIX + key, min=start, max="+", count=count))
        out: list[tuple[str, bytes]] = []
        for entry, fields in raw or ():
            value = (fields or {}).get(b"v")
            if isinstance(value, bytes):
                out.append((entry.decode() if isinstance(entry, bytes) else str(entry), value))
        return out

    async def ping(self) -> None:
        await self._call("ping", self._redis.ping())

    async def close(self) -> None:
        try:
            await self._redis.aclose()
            await self._redis.connection_pool.disconnect()
        except (RedisError, OSError):
            pass


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))
