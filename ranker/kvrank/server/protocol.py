"""A scoring request shed the moment its headers are parsed: uvicorn's HTTP protocol with
one step added.

Under a spike most scoring requests are shed, and a refusal answered by the ASGI app still
costs the event loop a task, the middleware stack, a response object and two socket
writes: ~0.2 ms of interpreter time each on a 2-core machine (0.085 ms of it the access
line), time the model thread waits for the interpreter lock. At 10x a ranker's miss
capacity that left 0.56-0.57x of it answered in time, and shed answers took 18 ms at p99.
Here the protocol screens a scoring request as soon as its headers are in (the check the
edge makes: :meth:`kvrank.admission.Admission.screen`) and, when it is refused, writes the
whole answer at once and discards its body as it arrives; with shed access lines sampled
(:func:`kvrank.server.logs.shed_line_due`) a refusal costs ~0.1 ms, and at 10x 0.64-0.68x
of the capacity was answered in time, shed p99 5-7 ms (docs/benchmarks.md).

Only a plain case takes this path: ``POST /v1/score`` on the scoring port, a keep-alive
connection with no earlier request still being answered on it (answers go out in order),
a declared body within the limit and a well-formed deadline header. Everything else goes
on through the app as before, and so does an admitted request, its deadline in the scope's
state for the route (the edge, :mod:`kvrank.server.edge`, screens only what this did not).
The answer is the edge's: the same status, headers, body, response counter and access line.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from kvrank.metrics import SCORE_ROUTE
from kvrank.server.edge import (
    POD_HEADER,
    Headers,
    Refusal,
    Screener,
    access_line,
    caller_id,
    error_body,
)

_SCORE_URL = SCORE_ROUTE.encode()
_STATUS_LINE = b"HTTP/1.1 503 Service Unavailable\r\n"


def shed_answer(
    screener: Screener,
    refusal: Refusal,
    headers: Headers,
    default_headers: list[tuple[bytes, bytes]],
    started: float,
) -> bytes:
    """The whole answer to a shed request (``refusal``, the screener's), status line to body,
    counted and logged as the edge does (``started``: when the headers were in, on
    :func:`time.perf_counter`)."""
    request_id = caller_id(headers.get(b"x-request-id", b"")) or uuid.uuid4().hex
    body = json.dumps(error_body(refusal.message, request_id), separators=(",", ":")).encode()
    fields = [
        *default_headers,
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in (refusal.headers or {}).items()),
        (b"x-request-id", request_id.encode()),
        POD_HEADER,
    ]
    screener.observe(SCORE_ROUTE, 503)
    access_line(request_id, 503, started, None, shed=True)
    lines = (k + b": " + v + b"\r\n" for k, v in fields)
    return b"".join([_STATUS_LINE, *lines, b"\r\n", body])


def screening_protocol(screener: Screener) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, shedding with ``screener`` as headers complete."""

    class ScreeningProtocol(HttpToolsProtocol):
        def on_headers_complete(self) -> None:
            started = time.perf_counter()
            refused = self._refused()
            if refused is None:
                super().on_headers_complete()
                return
            refusal, headers = refused
            default_headers = self.server_state.default_headers
            answer = shed_answer(screener, refusal, headers, default_headers, started)
            self.transport.write(answer)
            # an answered cycle: the body that follows is discarded as it arrives
            self.cycle = RequestResponseCycle(
                scope=self.scope,
                transport=self.transport,
                flow=self.flow,
                logger=self.logger,
                access_logger=self.access_logger,
                access_log=False,
                default_headers=default_headers,
                message_event=asyncio.Event(),
                expect_100_continue=False,
                keep_alive=True,
                on_response=self.on_response_complete,
            )
            self.cycle.response_complete = True
            self.on_response_complete()

        def _refused(self) -> tuple[Refusal, Headers] | None:
            """The refusal and the headers of a plain scoring request that is shed."""
            busy = self.cycle is not None and not self.cycle.response_complete
            if (
                busy
                or self.url != _SCORE_URL
                or self.parser.get_method() != b"POST"
                or not self.parser.should_keep_alive()
                or self.parser.should_upgrade()
            ):
                return None
            headers = dict(self.headers)
            local_port = self.server[1] if self.server else None
            refusal = screener.check(SCORE_ROUTE, "POST", headers, self.scope["state"], local_port)
            # only a shed one is answered here: the app answers the others as the edge does
            return None if refusal is None or refusal.shed is None else (refusal, headers)

    return ScreeningProtocol
