"""The one interface every cache tier implements: a store of values by ``CacheKey``.

A store keeps entries and, next to them, one :class:`~kvrank.cache.keys.Head` per user
(the latest cached length and chain hash, for prefix lookups). Every operation is async
and never raises for a storage problem: a failure reads as a miss (``None``), a write or
delete that did not happen as ``False``/``0``. L1 stores ``UserKV`` objects on the model's
device; Redis stores the bytes made by :mod:`kvrank.cache.entry` — serialisation is the
tiered cache's business, not a tier's.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from kvrank.cache.keys import CacheKey, Head

V = TypeVar("V")


class Store(Protocol[V]):
    """What the tiered cache (and the shared conformance suite) may call on a tier."""

    async def get(self, key: CacheKey) -> V | None:
        """The entry, or ``None`` (absent, expired, or the tier failed)."""
        ...

    async def put(self, key: CacheKey, value: V, ttl_s: float, events: int | None) -> bool:
        """Store ``value`` for ``ttl_s`` and point the user's head at it.

        ``events``: how many user events the entry covers (recorded in the head); ``None``
        when the caller does not know (an entry found by its hash alone): the head is left
        as it is. Returns ``False`` when nothing was stored (too large, failure).
        """
        ...

    async def delete(self, key: CacheKey) -> bool:
        """Remove one entry; ``True`` when it existed."""
        ...

    async def head(self, key: CacheKey) -> Head | None:
        """The head of ``key``'s user (same namespace and model version), or ``None``."""
        ...

    async def delete_user(self, namespace: str, model_version: str, user_id: str) -> int:
        """Remove every entry and the head of one user; returns the entries removed."""
        ...

    async def ping(self) -> bool:
        """Whether the tier answers now."""
        ...

    async def close(self) -> None:
        """Release connections (the cache closes its tiers once)."""
        ...
