"""A front's side of the engine: :class:`RemoteService`, the service the front's routes call,
which hands each request to the engine over one Unix-socket connection.

The front keeps what needs no model: parsing, validating and turning bodies into tensors
(the routes, unchanged), the caller's deadline, and a first screen of each request on its
headers against the engine's load as of its latest answer (:class:`FrontAdmission`) — a
spike is refused at the front at the cost of a header, without a message to the engine.
The engine admits again with its own queue in view, and that verdict is final.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from kvrank.admission import Admission, AdmissionSettings, Deadline, Patience
from kvrank.cache import Outcome, TTLSettings, sequence_chain
from kvrank.engine import wire
from kvrank.errors import Abandoned
from kvrank.metrics import Metrics
from kvrank.model.contract import CandidateInput, FeatureSpec, UserInput
from kvrank.model.features import check_candidates, check_user
from kvrank.service import ModelInputs, ScoreResult

log = logging.getLogger("kvrank.front")


class EngineClient:
    """One connection to the engine: calls matched to answers by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[wire.FromEngine]] = {}
        self._listener = asyncio.create_task(self._listen())
        self.on_load: list[Callable[[wire.Load], None]] = []
        """Called with each :class:`~kvrank.engine.wire.Load` an answer carries."""
        self.on_gone: Callable[[], None] | None = None
        """Called when the engine closes the connection (it has stopped or died)."""

    @classmethod
    async def connect(cls, path: str) -> EngineClient:
        reader, writer = await asyncio.open_unix_connection(path, limit=wire.MAX_FRAME)
        return cls(reader, writer)

    def next_id(self) -> int:
        return next(self._ids)

    async def call(self, message: wire.Call) -> wire.FromEngine:
        """``message``'s answer (a :class:`~kvrank.engine.wire.Failed` raised as its
        error; :class:`~kvrank.engine.wire.EngineError` once the engine has gone)."""
        call_id = message.id
        answer: asyncio.Future[wire.FromEngine] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = answer
        try:
            self.note(message)
            reply = await answer
        finally:
            self._waiting.pop(call_id, None)
        if isinstance(reply, wire.Failed):
            raise wire.error(reply)
        return reply

    def note(self, message: wire.ToEngine) -> None:
        """Send ``message`` (no answer awaited)."""
        if self._listener.done():
            raise wire.EngineError("the engine has gone")
        wire.send(self._writer, message)

    async def _listen(self) -> None:
        try:
            while True:
                reply = await wire.from_engine(self._reader)
                load = getattr(reply, "load", None)
                if load is not None:
                    for hear in self.on_load:
                        hear(load)
                answer = self._waiting.get(reply.id)
                if answer is not None and not answer.done():
                    answer.set_result(reply)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            log.error("the engine has gone: %s", exc)
            if self.on_gone is not None:
                self.on_gone()
        finally:
            gone = wire.EngineError("the engine has gone")
            for answer in self._waiting.values():
                if not answer.done():
                    answer.set_exception(gone)

    async def close(self) -> None:
        self._listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._listener
        self._writer.close()


class _EnginePatience(Patience):
    """The engine's estimate of how long silent callers wait (it sees them leave)."""

    def __init__(self, quantile: float) -> None:
        super().__init__(quantile)
        self.engine_s: float | None = None

    def estimate_s(self) -> float | None:
        return self.engine_s


class FrontAdmission(Admission):
    """Admission control's screen in a front: the engine's load as of its latest answer
    stands for the queue. Sheds are counted by the engine (one ``kvrank_shed_requests``
    for the pod); a caller that hangs up is told to it (its work is dropped there)."""

    def __init__(self, settings: AdmissionSettings, client: EngineClient) -> None:
        super().__init__(settings)
        self.client = client
        self.load = wire.Load(0.0, 0.0, 0, None)
        self._patience = _EnginePatience(settings.patience_quantile)
        self.patience = self._patience
        self.calls: dict[int, int] = {}
        """``id()`` of the deadline of each request in the engine → its call id."""
        client.on_load.append(self.hear)

    def hear(self, load: wire.Load) -> None:
        self.load = load
        self.cost_s = load.cost_s
        self._patience.engine_s = load.patience_s

    @property
    def inflight(self) -> int:
        return self.load.inflight

    def estimated_wait_s(self) -> float:
        return self.load.wait_s

    def caller_left(self, deadline: Deadline) -> None:
        """Tell the engine, whose copy of the deadline drops the work; before the request
        has gone there, it never will (:meth:`RemoteService._score`)."""
        call_id = self.calls.get(id(deadline))
        if deadline.leave():
            self.client.note(wire.Leave(call_id) if call_id is not None else wire.Left())

    def _shed(self, reason: str, why: str) -> None:
        with contextlib.suppress(wire.EngineError):
            self.client.note(wire.Shed(reason))
        super()._shed(reason, why)


@dataclass(frozen=True)
class EngineModel:
    """The model as a front knows it (from the engine's hello)."""

    version: str
    device: torch.device


@dataclass(frozen=True)
class EngineCache:
    l1_budget_bytes: int

    def set_secrets(self, secrets: Sequence[bytes]) -> None:
        """The engine reloads the secrets file itself: nothing to hand over."""


class RemoteService:
    """The :class:`~kvrank.service.Service` of a front: each call a message to the engine."""

    def __init__(
        self,
        client: EngineClient,
        hello: wire.Hello,
        settings: AdmissionSettings,
        namespace: str,
        metrics_dir: str,
    ) -> None:
        self.client = client
        self.model = EngineModel(hello.model_version, torch.device(hello.device))
        self.features: FeatureSpec = hello.features
        self.fingerprint = hello.fingerprint
        self.cache = EngineCache(hello.l1_budget_bytes)
        self.metrics = Metrics(hello.model_version, namespace, device=hello.device)
        self.admission = FrontAdmission(settings, client)
        self.metrics_dir = metrics_dir
        """Where every process of the pod keeps its counters (prometheus_client's
        multiprocess mode): a scrape of any front adds them all up."""

    @classmethod
    async def connect(
        cls, path: str, settings: AdmissionSettings, namespace: str, metrics_dir: str
    ) -> RemoteService:
        client = await EngineClient.connect(path)
        reply = await client.call(wire.Ask(client.next_id(), "hello"))
        assert isinstance(reply, wire.Answer)
        return cls(client, wire.hello_of(reply.value), settings, namespace, metrics_dir)

    def deadline(self, timeout_ms: float | None = None) -> Deadline:
        return self.admission.deadline(timeout_ms)

    async def score(
        self, inputs: ModelInputs, deadline: Deadline | None = None, protocol: str = "json"
    ) -> ScoreResult:
        """The engine's scores. A whole history and its candidates are checked here, and
        the history hashed (the engine repeats neither); by reference or as the events since
        a hash, the engine checks the candidates as it finds the entry."""
        history: dict[str, Any] = {"field": inputs.seq_hash_from}
        if inputs.since is not None and inputs.events is not None:
            history |= {"since": inputs.since, "events": wire.arrays(inputs.events)}
        elif inputs.seq_hash is not None:
            history["seq_hash"] = inputs.seq_hash
        elif inputs.user is not None:
            user = inputs.user
            check_user(self.features, user)
            check_candidates(self.features, inputs.candidates)
            history |= {
                "events": wire.arrays(user.events),
                "user": wire.arrays(user.user),
                "hashed": sequence_chain(user, self.fingerprint, self.features).seq_hash,
            }
        return await self._score(inputs.user_id, inputs.candidates, deadline, protocol, **history)

    async def _score(
        self,
        user_id: str,
        cands: CandidateInput,
        deadline: Deadline | None,
        protocol: str,
        **history: Any,
    ) -> ScoreResult:
        d = deadline or self.deadline()
        if d.caller_left:  # gone while its body was read: nothing goes to the engine
            raise Abandoned("disconnected", "admitted", None)
        call = wire.Score(
            self.client.next_id(),
            user_id,
            wire.arrays(cands.columns),
            d.at,
            d.started,
            d.share,
            d.stated,
            protocol,
            **history,
        )
        self.admission.calls[id(d)] = call.id
        try:
            reply = await self.client.call(call)
        finally:
            del self.admission.calls[id(d)]
        assert isinstance(reply, wire.Scored)
        return ScoreResult(
            reply.scores.tensor(),
            reply.logits.tensor(),
            Outcome(reply.outcome),
            reply.timings_ms,
            reply.seq_hash,
            reply.events,
        )

    def prefetch(self, user_id: str, user: UserInput) -> Coroutine[None, None, Outcome]:
        check_user(self.features, user)  # the caller hears of bad input, before its 202
        call = wire.Prefetch(
            self.client.next_id(), user_id, wire.arrays(user.events), wire.arrays(user.user)
        )
        return self._prefetch(call)

    async def _prefetch(self, call: wire.Prefetch) -> Outcome:
        reply = await self.client.call(call)
        assert isinstance(reply, wire.Answer)
        return Outcome(reply.value)

    async def invalidate_user(self, user_id: str) -> int:
        reply = await self.client.call(wire.Invalidate(self.client.next_id(), user_id))
        assert isinstance(reply, wire.Answer)
        return int(reply.value)

    def set_ttl(self, settings: TTLSettings) -> None:
        """The engine reloads the config file itself: nothing to hand over."""

    async def ttl_in_force(self) -> tuple[TTLSettings, float]:
        reply = await self.client.call(wire.Ask(self.client.next_id(), "ttl"))
        assert isinstance(reply, wire.Answer)
        return TTLSettings.model_validate(reply.value["ttl"]), float(reply.value["effective"])

    async def exposition(self) -> bytes:
        """Every process's counters and histograms added up, and the engine's scrape-time
        state (cache, admission, its process)."""
        registry = CollectorRegistry()
        MultiProcessCollector(registry, self.metrics_dir)  # type: ignore[no-untyped-call]
        reply = await self.client.call(wire.Ask(self.client.next_id(), "metrics"))
        assert isinstance(reply, wire.Answer)
        return generate_latest(registry) + bytes(reply.value)

    async def warm_up(self) -> None:
        """The engine warmed up before it took connections."""

    async def close(self) -> None:
        await self.client.close()
