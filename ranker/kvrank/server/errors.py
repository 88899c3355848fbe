"""Domain errors to HTTP answers, at the boundary only.

- ``InputError`` and a body that fails the model's schema → 422 naming the field;
- ``HeaderError`` (a header out of its limits; the routing header naming another user than
  the body) → 400 naming the header;
- ``IncompatibleKVError`` → 409;
- ``HistoryRequired`` (a history sent by reference that no tier holds) → 412 naming
  ``seq_hash`` or ``If-Match``, its message starting ``history_required`` (also in
  ``x-kvrank-error``), before any model work: the caller sends its events;
- ``Overloaded`` (shed by admission control, before any model work) → 503 with
  ``Retry-After`` and ``x-kvrank-shed`` (the edge answers the same for a request it sheds
  on its headers alone);
- ``Abandoned`` (dropped uncomputed) → 504 when the deadline passed; 499 when the caller
  left (nobody reads it: it is there for the access line);
- a streamed body over ``max_body_bytes`` → 413 naming ``body`` (a declared one is refused
  by :mod:`kvrank.server.edge` before the app runs);
- anything else → 500 with the request id and no stack trace (the edge).

Every error answer has the one shape of :func:`kvrank.server.edge.error_body`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvrank.errors import (
    Abandoned,
    HeaderError,
    HistoryRequired,
    IncompatibleKVError,
    InputError,
    Overloaded,
)
from kvrank.server.edge import BodyTooLarge, error_body, shed_headers


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(InputError, _bad_input)  # type: ignore[arg-type]
    app.add_exception_handler(HeaderError, _bad_header)  # type: ignore[arg-type]
    app.add_exception_handler(IncompatibleKVError, _incompatible)  # type: ignore[arg-type]
    app.add_exception_handler(Overloaded, _overloaded)  # type: ignore[arg-type]
    app.add_exception_handler(Abandoned, _abandoned)  # type: ignore[arg-type]
    app.add_exception_handler(HistoryRequired, _history_required)  # type: ignore[arg-type]


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    field = ".".join(str(p) for p in first["loc"] if p != "body")
    return _error(422, field, str(first["msg"]), request, details=_safe(exc.errors()))


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    if isinstance(exc, BodyTooLarge):
        return _error(413, "body", exc.detail, request)
    return await http_exception_handler(request, exc)


async def _bad_input(request: Request, exc: InputError) -> JSONResponse:
    return _error(422, exc.field, exc.problem, request)


async def _bad_header(request: Request, exc: HeaderError) -> JSONResponse:
    return _error(400, exc.field, exc.problem, request)


async def _overloaded(request: Request, exc: Overloaded) -> JSONResponse:
    # shed after its body was read (most are shed on their headers, by the edge)
    answer = _error(503, None, str(exc), request)
    answer.headers.update(shed_headers(exc))
    return answer


async def _abandoned(request: Request, exc: Abandoned) -> JSONResponse:
    return _error(499 if exc.reason == "disconnected" else 504, None, str(exc), request)


async def _history_required(request: Request, exc: HistoryRequired) -> JSONResponse:
    answer = _error(412, exc.field, str(exc), request)
    answer.headers["x-kvrank-error"] = "history_required"
    return answer


async def _incompatible(request: Request, exc: IncompatibleKVError) -> JSONResponse:
    return _error(409, None, str(exc), request)


def _safe(errors: Any) -> list[dict[str, Any]]:
    return [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg"))} for e in errors]


def _error(
    status: int,
    field: str | None,
    message: str,
    request: Request,
    details: list[dict[str, Any]] | None = None,
) -> JSONResponse:
    request_id = getattr(request.state, "request_id", None)
    return JSONResponse(error_body(message, request_id, field, details), status_code=status)
