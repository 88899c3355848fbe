"""L2: entries in Redis (standalone or Redis Cluster) through redis-py.

A ``Store[bytes]``: it keeps what :mod:`kvrank.cache.entry` encodes and knows nothing of
``UserKV``, so admin tools use it without the model code. Every operation has a timeout
and goes through a circuit breaker; a timeout, connection error or open breaker is a miss
(``None``/``False``) and counted — never raised to the request. The cross-pod lock says
whether it was taken, is held by someone else, or could not be asked about.

Large entries are read with redis-py's blocking client on a few threads of their own;
everything else (small reads, writes, heads, locks) goes through its asyncio client. A
production-size entry is ~9 MB: the asyncio client reads it through a stream reader that
pauses and resumes the socket every 128 KiB and copies it twice more, which made a 9.27 MB
GET take 10–22 ms on loopback where the blocking client, reading straight into its buffer,
takes ~9.4 ms (a raw socket 7–9 ms). Below ~1 MB the thread hop costs more than it saves
(a 118 KB GET: 0.19 ms asyncio, 0.33 ms on a thread), and writes are the other way round (a
blocking 9 MB SET took 23 ms, the asyncio one 9), so the store reads on a thread only while
its entries are typically large (``threaded_read_bytes``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import secrets
import threading
import urllib.parse
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
import redis.cluster
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError
from redis.retry import Retry

from kvrank.cache.breaker import CircuitBreaker
from kvrank.cache.keys import CacheKey, Head, entry_prefix, head_key
from kvrank.cache.lock import Lock, LockState
from kvrank_common import namespace_patterns

T = TypeVar("T")
log = logging.getLogger("kvrank.cache.redis")

_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class _Failed(enum.Enum):
    """What :meth:`RedisStore._call` returns when Redis did not answer (falsy, like a miss),
    so that a failure is never confused with an answer of ``None`` or ``0``."""

    UNAVAILABLE = enum.auto()

    def __bool__(self) -> bool:
        return False


UNAVAILABLE = _Failed.UNAVAILABLE


@dataclass
class RedisSettings:
    """How to reach Redis; secrets come from the environment or a mounted Secret."""

    url: str
    cluster: bool = False
    password: str | None = None
    tls_ca_file: str | None = None
    """``rediss://``: trust only this CA (default: the system's)."""
    tls_check_hostname: bool = True
    """``rediss://``: the certificate must name the host dialled. Off only with a private CA
    whose every certificate belongs to this cluster (its nodes announce IPs, which no
    certificate names); the chain is verified either way."""
    op_timeout_s: float = 0.02
    """Per read/write of one entry; small entries take well under 1 ms on a LAN."""
    connect_timeout_s: float = 0.2
    max_connections: int = 64
    read_threads: int = 4
    """Threads (each with its own connection) reading large entries: concurrent L2 hits
    beyond this many wait their turn, within ``op_timeout_s``."""
    threaded_read_bytes: int = 1 << 20
    """Entries are read on a thread while the typical entry (a moving average of those
    written and read) is at least this large."""


@dataclass
class L2Stats:
    """Totals since start (monotonic; the cache's collector reads them at scrape time)."""

    hits: int = 0
    misses: int = 0
    errors: int = 0
    writes: int = 0
    refused: int = 0
    """Calls not attempted because the breaker was open."""
    bytes_read: int = 0
    """Entry bytes read (hits): the egress a pod costs Redis."""


def make_client(settings: RedisSettings) -> Any:
    """redis-py's asyncio client (a cluster client when ``settings.cluster``)."""
    kwargs = _client_kwargs(settings)
    if settings.cluster:
        kwargs.pop("max_connections")
        return RedisCluster.from_url(settings.url, **kwargs)
    # one immediate retry: a pooled connection to a Redis that restarted since is closed, and
    # only a failed command finds out (``from_url`` alone gives connections no retry at all)
    return aioredis.Redis.from_url(settings.url, retry=AsyncRetry(NoBackoff(), 1), **kwargs)


def make_blocking_client(settings: RedisSettings) -> Any:
    """redis-py's blocking client for the same Redis (a cluster client connects at once).

    It retries once, at once (a pooled connection may predate a Redis restart; a cluster
    client re-reads the topology, on its thread, after a node fails): beyond that a failed
    read is a miss and the breaker's business, and a thread busy retrying would hold up the
    reads queued behind it."""
    kwargs = _client_kwargs(settings) | {
        "max_connections": settings.read_threads,
        "retry": Retry(NoBackoff(), 1),
    }
    if settings.cluster:
        return redis.cluster.RedisCluster.from_url(settings.url, **kwargs)
    return redis.Redis.from_url(settings.url, **kwargs)


def _client_kwargs(settings: RedisSettings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "password": settings.password,
        "socket_timeout": max(settings.op_timeout_s * 10, 0.5),
        "socket_connect_timeout": settings.connect_timeout_s,
        "max_connections": settings.max_connections,
    }
    if settings.tls_ca_file:
        kwargs["ssl_ca_certs"] = settings.tls_ca_file
    if settings.url.startswith("rediss://"):
        kwargs["ssl_check_hostname"] = settings.tls_check_hostname
    return kwargs


@dataclass
class RedisStore:
    settings: RedisSettings
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    stats: L2Stats = field(default_factory=L2Stats)

    def __post_init__(self) -> None:
        self.client = make_client(self.settings)
        self._topology: asyncio.Future[Any] | None = None
        self._reads = ThreadPoolExecutor(self.settings.read_threads, thread_name_prefix="kvrank-l2")
        self._reader: Any = None  # the blocking client, made on the first read's thread
        self._reader_made = threading.Lock()
        self._typical_bytes: float | None = None

    async def _with_topology(self, op: Callable[[], Awaitable[T]]) -> T:
        """A cluster client that lost a node rebuilds its view (CLUSTER SLOTS, then the whole
        COMMAND table) before its next command. That rebuild runs as a task of its own:
        bounded by one operation's timeout it would be cancelled whenever it is slower than
        one operation — and start over, and never finish. Shielded, it completes in the
        background; calls in between time out as misses. (redis-py says a rebuild is due
        only through its private ``_initialize`` flag; without the flag, every call would
        pay for a task.)"""
        if self.settings.cluster and getattr(self.client, "_initialize", False):
            if self._topology is None or self._topology.done():
                self._topology = asyncio.ensure_future(self.client.initialize())
                # its failure reaches whoever awaits it; retrieved here too, never unseen
                self._topology.add_done_callback(lambda t: t.cancelled() or t.exception())
            await asyncio.shield(self._topology)
        return await op()

    async def close(self) -> None:
        await self.client.aclose()
        # reads in flight end within the socket timeout; queued ones are dropped
        await asyncio.to_thread(self._reads.shutdown, wait=True, cancel_futures=True)
        if self._reader is not None:
            self._reader.close()

    async def get(self, key: CacheKey) -> bytes | None:
        k = key.to_string()
        if (self._typical_bytes or 0) >= self.settings.threaded_read_bytes:
            loop = asyncio.get_running_loop()
            data = await self._call(
                lambda: loop.run_in_executor(self._reads, self._read, k),
                topology=False,  # the blocking client keeps its own view of the cluster
            )
        else:
            data = await self._call(lambda: self.client.get(k))
        if data is UNAVAILABLE or not data:
            self.stats.misses += 1
            return None
        if not isinstance(data, bytes | bytearray | memoryview):
            # a reply that is not a value: seen from the cluster client while a node fails
            # over (another command's answer on a reused connection); a miss, never a crash
            log.warning("redis GET answered a %s, not bytes: a miss", type(data).__name__)
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        self.stats.bytes_read += len(data)
        self._seen(len(data))
        return bytes(data)

    def _seen(self, size: int) -> None:
        typical = self._typical_bytes
        self._typical_bytes = size if typical is None else 0.9 * typical + 0.1 * size

    def _read(self, key: str) -> bytes | None:
        """One entry GET, on a read thread."""
        with self._reader_made:  # a cluster client connects when made: not at start-up
            if self._reader is None:
                self._reader = make_blocking_client(self.settings)
        data: bytes | None = self._reader.get(key)
        return data

    async def put(self, key: CacheKey, value: bytes, ttl_s: float, events: int | None) -> bool:
        self._seen(len(value))
        ttl_ms = _ms(ttl_s)
        ok = await self._call(lambda: self.client.set(key.to_string(), value, px=ttl_ms))
        if not ok:
            return False
        self.stats.writes += 1
        if events is None:
            return True
        # payload before metadata: a head never points at an entry not yet written
        head = Head(events, key.seq_hash).to_json()
        await self._call(lambda: self.client.set(key.head_key(), head, px=ttl_ms))
        return True

    async def delete(self, key: CacheKey) -> bool:
        return await self._unlink(key.to_string()) > 0

    async def head(self, key: CacheKey) -> Head | None:
        raw = await self._call(lambda: self.client.get(key.head_key()))
        return None if raw is UNAVAILABLE or raw is None else Head.from_json(raw)

    async def delete_user(self, namespace: str, model_version: str, user_id: str) -> int:
        keys: list[str] = []
        try:  # SCAN is not one operation: no per-operation timeout, no breaker
            # the prefix matched literally: a glob character in it would widen the match
            pattern = _glob_escape(entry_prefix(namespace, model_version, user_id)) + "*"
            async for key in self.client.scan_iter(match=pattern, count=500):
                keys.append(key.decode() if isinstance(key, bytes) else str(key))
        except (OSError, RedisError, RedisClusterException):
            pass  # best effort while L2 is failing: what was found is still removed
        removed = sum([await self._unlink(k) for k in keys])
        await self._unlink(head_key(namespace, model_version, user_id))
        return removed

    async def acquire(self, key: CacheKey, ttl_s: float) -> Lock:
        """Try to take ``key``'s lock; it expires by itself (a crashed holder frees it)."""
        token, lock_key = secrets.token_hex(8), key.lock_key()
        ok = await self._call(lambda: self.client.set(lock_key, token, nx=True, px=_ms(ttl_s)))
        if ok:
            return Lock(LockState.ACQUIRED, token)
        if ok is not UNAVAILABLE:
            return Lock(LockState.HELD)
        # The SET timed out or failed: it may still have landed. Ask who holds the lock.
        holder = await self._call(lambda: self.client.get(lock_key))
        if holder is UNAVAILABLE or holder is None:
            return Lock(LockState.UNAVAILABLE)
        held_by = holder.decode() if isinstance(holder, bytes) else str(holder)
        return Lock(LockState.ACQUIRED, token) if held_by == token else Lock(LockState.HELD)

    async def release(self, key: CacheKey, lock: Lock) -> None:
        """Free a lock this process acquired (a stale token frees nothing)."""
        if lock.state is LockState.ACQUIRED:
            await self._call(lambda: self.client.eval(_RELEASE, 1, key.lock_key(), lock.token))

    async def ping(self) -> bool:
        return bool(await self._call(lambda: self.client.ping(), timeout=1.0))

    async def _unlink(self, key: str) -> int:
        # one key per call: keys may live in different cluster slots
        removed = await self._call(lambda: self.client.unlink(key))
        return 0 if removed is UNAVAILABLE else int(removed)

    async def _call(
        self, op: Callable[[], Awaitable[T]], timeout: float | None = None, topology: bool = True
    ) -> T | _Failed:
        if not self.breaker.allow():
            self.stats.refused += 1
            return UNAVAILABLE
        try:
            result = await asyncio.wait_for(
                self._with_topology(op) if topology else op(), timeout or self.settings.op_timeout_s
            )
        # a cluster client that cannot reach any node raises RedisClusterException, which is
        # no RedisError
        except (RedisError, RedisClusterException, OSError, TimeoutError) as exc:
            self.stats.errors += 1
            was_open = self.breaker.state == "open"
            self.breaker.failure()
            log.warning("redis operation failed (%s): %r", self.breaker.state, exc)
            if not was_open and self.breaker.state == "open":
                log.warning("L2 circuit opened after %d failures", self.breaker.failure_threshold)
            return UNAVAILABLE
        self.breaker.success()
        return result


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


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
            for pattern in namespace_patterns(namespace):
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
    # each master as the same user (an ACL user's name is in the URL, its password apart)
    url = urllib.parse.urlsplit(settings.url)
    user = f"{url.username}@" if url.username else ""
    return [
        make_client(
            RedisSettings(**{**base.__dict__, "url": f"{url.scheme}://{user}{n.host}:{n.port}"})
        )
        for n in nodes
    ]


def _glob_escape(text: str) -> str:
    """``text`` as a ``SCAN MATCH`` pattern that matches only itself."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
