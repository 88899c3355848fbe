"""What every HTTP request passes through before and after its route: an ASGI middleware.

It gives the request an id (the caller's ``x-request-id`` if it is a sane one, else a new
one) and returns it as a header with the answering pod's name (``x-kvrank-pod``: its host
name; what shows a user's requests sticking to one pod behind a router), keeps admin
routes off the scoring port, refuses bodies over ``max_body_bytes`` (declared or streamed)
with 413, screens each scoring request for admission (see :class:`Edge`), turns anything a
route raised into a 500 that names only the request id, counts the response per route
template and writes the access line.

A plain ASGI class rather than Starlette's ``BaseHTTPMiddleware``: that one runs each
request's route in a task group of its own and streams the answer back through a memory
channel, which cost about a millisecond a request here — a tenth of a quick-size score.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvrank.admission import Deadline
from kvrank.errors import HeaderError, Overloaded
from kvrank.metrics import INFER_ROUTES, SCORE_ROUTE
from kvrank.server import logs
from kvrank_common import SHED_HEADER

log = logging.getLogger("kvrank.server")
MAX_REQUEST_ID = 128
POD_HEADER = (b"x-kvrank-pod", socket.gethostname().encode("latin-1", "replace"))
"""Which pod answered: its host name (in Kubernetes, the pod's name)."""
"""On a shed answer (its reason): what a router retries on another pod, and only that — a
503 for any other cause is not retried."""

Headers = dict[bytes, bytes]
Screen = Callable[[Headers], Deadline | None]
"""Admission's look at a scoring request's headers, before anything else runs: returns the
request's deadline (the route's ``request.state.deadline``), raises
:class:`~kvrank.errors.Overloaded` to shed it or :class:`~kvrank.errors.HeaderError` for a
header out of its limits."""


class PlainRoute(APIRoute):
    """A route FastAPI documents (its response model, in the OpenAPI document) and calls as
    Starlette calls an endpoint: ``endpoint(request)``, with no dependency solved, no body
    read and no answer validated around it. The scoring routes read and check their bodies
    themselves, and :class:`Edge` calls them directly, past FastAPI's routing: its work per
    request is a measurable part of an L1 hit's time outside the model (``make
    bench-wire``)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler: Callable[[Request], Coroutine[Any, Any, Response]] = self.endpoint
        return handler


@dataclass
class AccessRecord:
    """What the scoring route knows of a request that its access line records; the route
    puts it on ``request.state.access`` and fills it in as it goes (a request refused
    half-way still logs what was known)."""

    user: str | None = None
    """The user id's keyed hash (never the id itself)."""
    cache: str | None = None
    """The cache outcome (``l1``, ``l2``, ``incremental``, ``miss``, ``none``)."""
    candidates: int | None = None
    model_version: str | None = None


def error_body(
    message: str,
    request_id: str | None,
    field: str | None = None,
    details: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The one shape of every error answer: what went wrong, the request id, the field."""
    body: dict[str, Any] = {"error": message, "request_id": request_id}
    if field is not None:
        body["field"] = field
    if details:
        body["details"] = details
    return body


def shed_headers(exc: Overloaded) -> dict[str, str]:
    """The headers of a shed answer: when to come back, and why it was shed."""
    return {"Retry-After": str(exc.retry_after_s), SHED_HEADER: exc.reason}


def access_line(
    request_id: str,
    status: int,
    started: float,
    record: AccessRecord | None,
    shed: bool,
    route: str = SCORE_ROUTE,
) -> None:
    """A scoring request's access line (``started``: its :func:`time.perf_counter`); a shed
    request's is sampled (:func:`kvrank.server.logs.shed_line_due`)."""
    extra = {}
    if shed:
        skipped = logs.shed_line_due()
        if skipped is None:
            return
        extra["sheds_not_logged"] = skipped
    fields = {
        "request_id": request_id,
        "route": route,
        "status": status,
        "latency_ms": round((time.perf_counter() - started) * 1e3, 2),
        **dataclasses.asdict(record or AccessRecord()),
        **extra,
    }
    logs.access(fields)


def caller_id(raw: bytes) -> str | None:
    """The caller's request id, kept so one id follows a request across services — if it
    is 1 to 128 visible ASCII characters; anything else is not written into our logs."""
    if 0 < len(raw) <= MAX_REQUEST_ID and all(0x21 <= c <= 0x7E for c in raw):
        return raw.decode("ascii")
    return None


class BodyTooLarge(HTTPException):
    """A streamed body grew past ``max_body_bytes``. An ``HTTPException`` so that FastAPI's
    body reader lets it through unwrapped; the app answers it 413 naming ``body``."""

    def __init__(self, message: str) -> None:
        super().__init__(413, message)


@dataclass(frozen=True)
class Refusal:
    """An answer the edge gives without routing the request."""

    code: int
    message: str
    field: str | None = None
    headers: dict[str, str] | None = None
    shed: Overloaded | None = None
    """Why it was shed (a 503 by admission control)."""
    screened: bool = False
    """A scoring request refused on its headers (counted and logged on the scoring route)."""


@dataclass(frozen=True)
class Screener:
    """The rules a request meets before it is routed, in one place: the edge middleware
    applies them, and ``kvrank serve``'s HTTP protocol applies them to a plain scoring
    request as its headers are parsed (:mod:`kvrank.server.protocol`), answering there only
    what is shed."""

    port: int
    admin_port: int | None
    max_body_bytes: int
    observe: Callable[[str, int], None]
    """``(route template, status code)`` of every answer (the responses counter)."""
    screen: Screen

    def check(
        self,
        path: str,
        method: str,
        headers: Headers,
        state: dict[str, Any],
        local_port: int | None,
    ) -> Refusal | None:
        """Why the request is answered here (the wrong port, a declared body over the
        limit, a scoring request refused on its headers); ``None``: it goes on to its
        route, a scoring request's deadline in ``state``. A scoring request screened once
        (its deadline in ``state``) is not screened again."""
        if not self.on_its_port(path, local_port):
            return Refusal(404, "not found")
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_body_bytes:
            return Refusal(413, self.too_large(f"request body of {int(length)} bytes"), "body")
        if path != SCORE_ROUTE or method != "POST" or "deadline" in state:
            return None
        try:
            state["deadline"] = self.screen(headers)
        except Overloaded as exc:
            return Refusal(503, str(exc), None, shed_headers(exc), shed=exc, screened=True)
        except HeaderError as exc:
            return Refusal(400, exc.problem, exc.field, screened=True)
        return None

    def too_large(self, what: str) -> str:
        return f"{what} exceeds max_body_bytes={self.max_body_bytes}"

    def on_its_port(self, path: str, local_port: int | None) -> bool:
        """With an admin port, /admin/* answers there only and everything else only on the
        main port: the scoring Service (main port) cannot reach admin actions."""
        if self.admin_port is None:
            return True
        return local_port == (self.admin_port if path.startswith("/admin/") else self.port)


class Edge:
    """The middleware. A scoring request not screened yet (``kvrank serve``'s HTTP protocol
    screens plain ones as their headers are parsed: :mod:`kvrank.server.protocol`) is
    screened for admission here, before FastAPI routes it: under a spike most requests are
    shed, and a shed answer built here skips routing, dependencies and exception handlers —
    about a quarter of what one costs the server otherwise, time its event loop would hold
    the interpreter lock that the model thread needs between torch calls."""

    def __init__(
        self, app: ASGIApp, *, screener: Screener, direct: Sequence[PlainRoute] = ()
    ) -> None:
        self.app = app
        self.screener = screener
        self.direct = tuple(direct)
        """Routes called from here, past FastAPI's router and middleware (see :meth:`call`)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = dict(scope["headers"])
        request_id = caller_id(headers.get(b"x-request-id", b"")) or uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        status = 500
        answered = shed = False
        ours = ((b"x-request-id", request_id.encode("latin-1")), POD_HEADER)

        async def send_with_id(message: Message) -> None:
            nonlocal status, answered
            if message["type"] == "http.response.start":
                status, answered = message["status"], True
                message = {**message, "headers": [*message.get("headers", ()), *ours]}
            await send(message)

        async def answer(
            code: int,
            message: str,
            field: str | None = None,
            extra: dict[str, str] | None = None,
        ) -> None:
            body = error_body(message, request_id, field)
            response = JSONResponse(body, status_code=code, headers=extra)
            await response(scope, receive, send_with_id)

        route = "unmatched"
        local_port = (scope.get("server") or (None, None))[1]
        refusal = self.screener.check(scope["path"], scope["method"], headers, state, local_port)
        if refusal is not None:
            if refusal.screened:
                route, shed = SCORE_ROUTE, refusal.shed is not None
            await answer(refusal.code, refusal.message, refusal.field, refusal.headers)
        else:
            try:
                await self.call(scope, self._bounded(receive), send_with_id)
            except Exception:
                log.exception("request %s failed", request_id)
                if not answered:
                    await answer(500, "internal error")
        # the matched template, not the path: bounded cardinality
        route = getattr(scope.get("route"), "path", route)
        self.screener.observe(route, status)
        if route == SCORE_ROUTE or route in INFER_ROUTES:
            access_line(request_id, status, started, state.get("access"), shed, route)

    async def call(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The request's route. One of :attr:`direct` (the scoring routes) is called here:
        matched as FastAPI's router would, its errors answered by the app's own exception
        handlers (anything else goes on to the edge's 500), the rest of FastAPI's work per
        request (matching through every route, its exception and exit-stack middleware)
        skipped: a JSON L1 hit's CPU outside the model 0.95× what it was (``make
        bench-wire``). Everything else goes through the app."""
        route = self._direct(scope)
        if route is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await route.endpoint(request)
        except Exception as exc:
            handler = _handler(scope["app"].exception_handlers, exc)
            if handler is None:
                raise
            response = await handler(request, exc)
        await response(scope, receive, send)

    def _direct(self, scope: Scope) -> PlainRoute | None:
        """The direct route that matches the request (its path parameters and itself put in
        ``scope``, as the router does), if one does."""
        for route in self.direct:
            match, child = route.matches(scope)
            if match is Match.FULL:
                scope.update(child)
                return route
        return None

    def _bounded(self, receive: Receive) -> Receive:
        """``receive``, refusing a streamed body once it grows past ``max_body_bytes``."""
        received = 0

        async def receive_bounded() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.screener.max_body_bytes:
                    raise BodyTooLarge(self.screener.too_large("streamed request body"))
            return message

        return receive_bounded


def _handler(handlers: dict[Any, Any], exc: Exception) -> Any:
    """The app's handler for ``exc``: its class's or its nearest base's, as Starlette
    looks one up."""
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    return None
