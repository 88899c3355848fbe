"""The cross-pod creation lock, as its own interface: one creator per key across pods.

A tier that other pods share (Redis) usually offers it too, but the cache takes it
separately (:class:`KeyLock`): a store is not a lock, and a cache may share entries through
one backend and lock through another. Taking a lock never raises: a backend that cannot
answer says ``UNAVAILABLE`` and the caller computes at once (nobody can be waited for).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from kvrank.cache.keys import CacheKey


class LockState(enum.Enum):
    ACQUIRED = "acquired"
    """This process holds the lock: it computes, writes, then releases."""
    HELD = "held"
    """Another process holds it: wait a bounded time for its entry."""
    UNAVAILABLE = "unavailable"
    """The backend could not answer: nobody can be waited for, compute at once."""


@dataclass(frozen=True)
class Lock:
    state: LockState
    token: str | None = None


NO_LOCK = Lock(LockState.UNAVAILABLE)
"""What a cache without a lock backend works with: nobody to share with, create at once."""


class KeyLock(Protocol):
    async def acquire(self, key: CacheKey, ttl_s: float) -> Lock:
        """Try to take ``key``'s lock; it expires by itself (a crashed holder frees it)."""
        ...

    async def release(self, key: CacheKey, lock: Lock) -> None:
        """Free a lock this process acquired (anything else frees nothing)."""
        ...
