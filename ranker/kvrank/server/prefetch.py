"""Prefetches in flight: ``POST /v1/prefetch`` answers 202 at once and the user's entry is
made behind it, at most ``prefetch_max_inflight`` at a time.

A prefetch is a hint from the retrieval stage (it knows the user before the ranking
request comes): nothing it meets reaches its caller, who already has the answer. A full
queue drops it (the ranking request will make the entry); so does a pod without model time
to spare (admission control's :meth:`~kvrank.admission.Admission.prefetch_refusal`: under
load a prefetch would only delay the scoring requests queued behind it, for no work saved);
an error is logged and counted; all are in ``kvrank_prefetches_total``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine

from kvrank.cache import Outcome
from kvrank.model.contract import UserInput
from kvrank.service import Service

log = logging.getLogger("kvrank.server")


class Prefetches:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def offer(self, service: Service, user_id: str, user: UserInput) -> bool:
        """Start making ``user``'s entry; ``False`` (dropped) when ``limit`` are in flight
        or the pod has no model time to spare. ``InputError`` for a bad ``user``, whether
        or not it would be dropped: that much the caller hears."""
        work = service.prefetch(user_id, user)
        if len(self._tasks) >= self.limit:
            service.metrics.prefetches["dropped"].inc()
            work.close()
            return False
        if service.admission.prefetch_refusal() is not None:
            service.metrics.prefetches["shed"].inc()
            work.close()
            return False
        task = asyncio.create_task(self._run(service, work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _run(self, service: Service, work: Coroutine[None, None, Outcome]) -> None:
        try:
            await work
        except Exception as exc:  # the caller had its 202: counted and logged, never raised
            service.metrics.prefetches["failed"].inc()
            log.warning("prefetch failed: %s: %s", type(exc).__name__, exc)

    async def stop(self) -> None:
        """Cancel what is still in flight (on shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
