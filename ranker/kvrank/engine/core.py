"""The engine: the serving process's :class:`~kvrank.service.RankingService` — model, cache
tiers, batcher, admission control — answering fronts over a Unix socket instead of HTTP.

Each front connects once; each message it sends becomes a task on the engine's event loop
calling the service, so requests from every front meet in the one model queue (continuous
batching takes them together) and in one admission control, which knows that queue. A
request's deadline crosses as the monotonic instant the caller stops waiting (the fronts
and the engine share the host's clock); a front that hears its caller hang up sends
:class:`~kvrank.engine.wire.Leave`, and that request's work still queued is dropped, never
computed — as in a single process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from prometheus_client import generate_latest

from kvrank.admission import Deadline
from kvrank.engine import wire
from kvrank.model.contract import CandidateInput, UserInput
from kvrank.service import ModelInputs, RankingService, ScoreResult

log = logging.getLogger("kvrank.engine")


class Engine:
    def __init__(self, service: RankingService) -> None:
        self.service = service

    def load(self) -> wire.Load:
        a = self.service.admission
        return wire.Load(a.estimated_wait_s(), a.cost_s, a.inflight, a.patience.estimate_s())

    def hello(self) -> wire.Hello:
        svc = self.service
        model = svc.model
        return wire.Hello(
            model.version,
            str(model.device),
            svc.features,
            svc.fingerprint,
            svc.cache.l1_budget_bytes,
        )

    async def serve(self, path: str) -> asyncio.Server:
        """Listen on the Unix socket ``path`` (the fronts connect there)."""
        return await asyncio.start_unix_server(self._front, path, limit=wire.MAX_FRAME)

    async def _front(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One front's connection, for its life: its requests run side by side."""
        waiting: dict[int, Deadline] = {}
        """Its requests in flight → their deadlines (what a Leave marks)."""
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                message = await wire.to_engine(reader)
                if isinstance(message, wire.Leave):
                    if (deadline := waiting.get(message.id)) is not None:
                        self.service.admission.caller_left(deadline)
                elif isinstance(message, wire.Shed):
                    self.service.admission.stats.shed[message.reason] += 1
                elif isinstance(message, wire.Left):
                    self.service.admission.stats.left += 1
                else:
                    task = asyncio.create_task(self._answer(message, writer, waiting))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the front has gone: what it asked for is no longer wanted
        finally:
            for task in tasks:
                task.cancel()
            writer.close()

    async def _answer(
        self, message: wire.Call, writer: asyncio.StreamWriter, waiting: dict[int, Deadline]
    ) -> None:
        call_id = message.id
        try:
            if isinstance(message, wire.Score):
                deadline = Deadline(
                    message.at, share=message.share, stated=message.stated, started=message.started
                )
                if not message.stated:  # what the engine learns ends it, as in one process
                    deadline.waits = self.service.admission.patience.estimate_s
                waiting[call_id] = deadline
                try:
                    result = await self._score(message, deadline)
                finally:
                    del waiting[call_id]
                reply: wire.FromEngine = _scored(call_id, result, self.load())
            else:
                reply = wire.Answer(call_id, await self._other(message))
        except Exception as exc:  # every failure is the front's to answer, never lost
            if not isinstance(exc, wire.KNOWN_ERRORS):
                log.exception("engine: %s failed", type(message).__name__)
            reply = wire.failure(call_id, exc, self.load())
        with contextlib.suppress(ConnectionError, RuntimeError):  # the front has gone
            wire.send(writer, reply)

    async def _score(self, m: wire.Score, deadline: Deadline) -> ScoreResult:
        events = None if m.events is None else wire.tensors(m.events)
        user = None
        if m.since is None and m.seq_hash is None and events is not None and m.user is not None:
            user = UserInput(events, wire.tensors(m.user))  # the history whole
        cands = CandidateInput(wire.tensors(m.candidates))
        inputs = ModelInputs(m.user_id, m.seq_hash, m.field, user, cands, m.since, events, m.hashed)
        return await self.service.score(inputs, deadline, m.protocol)

    async def _other(self, m: wire.Call) -> Any:
        svc = self.service
        if isinstance(m, wire.Prefetch):
            user = UserInput(wire.tensors(m.events), wire.tensors(m.user))
            return (await svc.prefetch(m.user_id, user)).value
        if isinstance(m, wire.Invalidate):
            return await svc.invalidate_user(m.user_id)
        if isinstance(m, wire.Ask) and m.what == "hello":
            return self.hello()
        if isinstance(m, wire.Ask) and m.what == "metrics":
            return generate_latest(svc.metrics.readers)
        if isinstance(m, wire.Ask) and m.what == "ttl":
            ttl, effective = await svc.ttl_in_force()
            return {"ttl": ttl.model_dump(mode="json"), "effective": effective}
        raise ValueError(f"an engine does not answer {type(m).__name__}")


def _scored(call_id: int, result: ScoreResult, load: wire.Load) -> wire.Scored:
    return wire.Scored(
        call_id,
        wire.Array.of(result.scores),
        wire.Array.of(result.logits),
        result.outcome.value,
        result.timings_ms,
        result.seq_hash,
        result.events,
        load,
    )
