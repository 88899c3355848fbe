"""L2: entries in Redis (standalone or Redis Cluster) through redis-py's asyncio client.

Every operation has a timeout and goes through a circuit breaker; a timeout, connection
error, open breaker or corrupt entry is reported as a miss (``None``/``False``) and
counted — never raised to the request. Corrupt entries are deleted. Writes carry a TTL
with jitter so that entries written together do not expire together.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from kvrank.cache.breaker import CircuitBreaker
from kvrank.cache.entry import decode_entry, encode_entry
from kvrank.cache.keys import namespace_pattern
from kvrank.errors import CorruptEntryError
from kvrank.model.kv import UserKV

T = TypeVar("T")
log = logging.getLogger("kvrank.cache.redis")
HELD = "held"
"""What :meth:`RedisTier.acquire` returns when another process holds the lock."""

_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


@dataclass
class RedisSettings:
    """How to reach Redis; secrets come from the environment or a mounted Secret."""

    url: str
    cluster: bool = False
    password: str | None = None
    tls_ca_file: str | None = None
    op_timeout_s: float = 0.02
    """Per read/write of one entry; small entries take well under 1 ms on a LAN."""
    connect_timeout_s: float = 0.2
    max_connections: int = 64


@dataclass
class L2Stats:
    hits: int = 0
    misses: int = 0
    errors: int = 0
    corrupt: int = 0
    writes: int = 0
    refused: int = 0  # calls not attempted because the breaker was open

    def reset(self) -> None:
        self.hits = self.misses = self.errors = self.corrupt = self.writes = self.refused = 0


def make_client(settings: RedisSettings) -> Any:
    kwargs: dict[str, Any] = {
        "password": settings.password,
        "socket_timeout": max(settings.op_timeout_s * 10, 0.5),
        "socket_connect_timeout": settings.connect_timeout_s,
        "max_connections": settings.max_connections,
    }
    if settings.tls_ca_file:
        kwargs["ssl_ca_certs"] = settings.tls_ca_file
    if settings.cluster:
        kwargs.pop("max_connections")
        return RedisCluster.from_url(settings.url, **kwargs)
    return aioredis.Redis.from_url(settings.url, **kwargs)


@dataclass
class RedisTier:
    settings: RedisSettings
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    stats: L2Stats = field(default_factory=L2Stats)

    def __post_init__(self) -> None:
        self.client = make_client(self.settings)
        self.last_decode_s = 0.0  # time the latest get spent validating/deserialising

    async def close(self) -> None:
        await self.client.aclose()

    async def _call(self, op: Callable[[], Awaitable[T]], timeout: float | None = None) -> T | None:
        if not self.breaker.allow():
            self.stats.refused += 1
            return None
        try:
            result = await asyncio.wait_for(op(), timeout or self.settings.op_timeout_s)
        except (RedisError, OSError, TimeoutError) as exc:
            self.stats.errors += 1
            was_open = self.breaker.state == "open"
            self.breaker.failure()
            log.warning("redis operation failed (%s): %r", self.breaker.state, exc)
            if not was_open and self.breaker.state == "open":
                log.warning("L2 circuit opened after %d failures", self.breaker.failure_threshold)
            return None
        self.breaker.success()
        return result

    async def get(
        self, key: str, model_version: str, fingerprint: str, device: str = "cpu"
    ) -> UserKV | None:
        data = await self._call(lambda: self.client.get(key))
        if data is None:
            self.stats.misses += 1
            return None
        started = time.perf_counter()
        try:
            kv = decode_entry(data, model_version, fingerprint, device)
            self.last_decode_s = time.perf_counter() - started
        except CorruptEntryError:
            self.stats.corrupt += 1
            self.stats.misses += 1
            await self._call(lambda: self.client.unlink(key))
            return None
        self.stats.hits += 1
        return kv

    async def put(self, key: str, kv: UserKV, ttl_s: float, jitter: float = 0.1) -> bool:
        ttl_ms = max(1, int(ttl_s * 1000 * (1.0 + random.uniform(-jitter, jitter))))
        data = encode_entry(kv)
        ok = await self._call(lambda: self.client.set(key, data, px=ttl_ms))
        if ok:
            self.stats.writes += 1
        return bool(ok)

    async def get_raw(self, key: str) -> bytes | None:
        return await self._call(lambda: self.client.get(key))

    async def set_raw(self, key: str, value: bytes | str, ttl_s: float) -> bool:
        ok = await self._call(lambda: self.client.set(key, value, px=max(1, int(ttl_s * 1000))))
        return bool(ok)

    async def delete(self, *keys: str) -> int:
        n = 0
        for key in keys:  # one key per call: keys may live in different cluster slots
            n += int(await self._call(lambda k=key: self.client.unlink(k)) or 0)  # type: ignore[misc]
        return n

    async def acquire(self, lock_key: str, ttl_s: float) -> str | None:
        """Try to take a lock that expires by itself.

        Returns the token on success, ``HELD`` when another holder has it, and ``None``
        when Redis could not answer (then nobody can be waited for: compute at once).
        """
        token = secrets.token_hex(8)
        errors = self.stats.errors + self.stats.refused
        ok = await self._call(
            lambda: self.client.set(lock_key, token, nx=True, px=max(1, int(ttl_s * 1000)))
        )
        if ok:
            return token
        if self.stats.errors + self.stats.refused == errors:
            return HELD
        # The SET timed out or failed: it may still have landed. Ask who holds the lock.
        holder = await self._call(lambda: self.client.get(lock_key))
        if holder is None:
            return None
        holder = holder.decode() if isinstance(holder, bytes) else str(holder)
        return token if holder == token else HELD

    async def release(self, lock_key: str, token: str) -> None:
        await self._call(lambda: self.client.eval(_RELEASE, 1, lock_key, token))

    async def ping(self) -> bool:
        return bool(await self._call(lambda: self.client.ping(), timeout=1.0))


async def purge_namespace(
    settings: RedisSettings, namespace: str, batch: int = 500, max_keys_per_s: float = 50_000
) -> int:
    """SCAN + UNLINK every key of ``namespace`` on every master; returns the count.

    Rate-limited to ``max_keys_per_s`` so a purge never starves serving traffic.
    """
    masters = await _masters(settings)
    removed = 0
    try:
        for node in masters:
            for pattern in namespace_pattern(namespace):
                keys: list[bytes] = []
                async for key in node.scan_iter(match=pattern, count=batch):
                    keys.append(key)
                    if len(keys) >= batch:
                        removed += await _unlink_batch(node, keys, max_keys_per_s)
                        keys = []
                if keys:
                    removed += await _unlink_batch(node, keys, max_keys_per_s)
    finally:
        for node in masters:
            await node.aclose()
    return removed


async def _unlink_batch(node: Any, keys: list[bytes], max_keys_per_s: float) -> int:
    # a node only holds keys of its own slots; per-key UNLINK avoids CROSSSLOT errors
    pipe = node.pipeline(transaction=False)
    for key in keys:
        pipe.unlink(key)
    removed = sum(int(x) for x in await pipe.execute())
    await asyncio.sleep(len(keys) / max_keys_per_s)
    return removed


async def _masters(settings: RedisSettings) -> list[Any]:
    """Standalone clients for every master (just the one server when not a cluster)."""
    base = RedisSettings(**{**settings.__dict__, "cluster": False, "op_timeout_s": 5.0})
    if not settings.cluster:
        return [make_client(base)]
    cluster = make_client(settings)
    try:
        await cluster.initialize()
        nodes = cluster.get_primaries()
    finally:
        await cluster.aclose()
    scheme = "rediss" if settings.url.startswith("rediss") else "redis"
    return [
        make_client(RedisSettings(**{**base.__dict__, "url": f"{scheme}://{n.host}:{n.port}"}))
        for n in nodes
    ]
