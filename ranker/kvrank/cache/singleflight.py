"""Stampede protection: one computation per key per process, and across processes.

In-process, concurrent callers for the same key share one ``asyncio.Future`` (waiters get
the creator's result). Across processes, the creator first tries a Redis lock that expires
by itself (a crashed holder frees it); a process that loses the race polls L2 for the
winner's entry for a bounded time (default 10 ms) and then computes anyway — a slow peer
must never stall a request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class FlightStats:
    leaders: int = 0  # computations started in this process
    shared: int = 0  # callers that got another caller's in-process result
    remote_waits: int = 0  # lost the cross-process lock and waited for the winner
    remote_hits: int = 0  # ... and found the winner's entry in time
    remote_timeouts: int = 0  # ... and computed themselves after the bound

    def reset(self) -> None:
        self.leaders = self.shared = self.remote_waits = 0
        self.remote_hits = self.remote_timeouts = 0


@dataclass
class SingleFlight(Generic[T]):
    stats: FlightStats = field(default_factory=FlightStats)

    def __post_init__(self) -> None:
        self._inflight: dict[str, asyncio.Future[T]] = {}

    async def do(self, key: str, create: Callable[[], Awaitable[T]]) -> T:
        """Run ``create`` once for ``key`` among concurrent callers in this process."""
        fut = self._inflight.get(key)
        if fut is not None:
            self.stats.shared += 1
            return await asyncio.shield(fut)
        fut = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        self.stats.leaders += 1
        try:
            result = await create()
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: waiters re-raise it, nobody else must
            raise
        else:
            fut.set_result(result)
            return result
        finally:
            del self._inflight[key]


async def wait_for_peer(
    poll: Callable[[], Awaitable[T | None]], bound_s: float, interval_s: float = 0.002
) -> T | None:
    """Poll ``poll`` until it returns a value or ``bound_s`` has passed."""
    deadline = time.monotonic() + bound_s
    while True:
        value = await poll()
        if value is not None:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        await asyncio.sleep(min(interval_s, remaining))
