"""The uvicorn internals the parse-time shed (:mod:`kvrank.server.protocol`) relies on, pinned.

The screening protocol subclasses uvicorn's private ``HttpToolsProtocol`` and builds its
``RequestResponseCycle`` by hand; ``pyproject.toml`` holds uvicorn below the next minor for
that reason. These tests say what an upgrade must keep, in uvicorn's own terms, before the
behavioural tests (``test_overload.py``, a real server on a socket) fail in less obvious
ways: the cycle's constructor takes exactly the arguments passed, and a shed request driven
through the real protocol class, in-process, is answered whole and leaves the connection
ready for the next request.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from kvrank.errors import Overloaded
from kvrank.server import protocol
from kvrank.server.edge import Headers, Screener
from kvrank.server.protocol import screening_protocol


def test_the_cycle_takes_exactly_the_arguments_the_screening_protocol_passes() -> None:
    calls = [
        node
        for node in ast.walk(ast.parse(inspect.getsource(protocol)))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "RequestResponseCycle"
    ]
    assert len(calls) == 1
    passed = {k.arg for k in calls[0].keywords}
    accepted = set(inspect.signature(RequestResponseCycle.__init__).parameters) - {"self"}
    assert passed == accepted, f"uvicorn {uvicorn.__version__}: {passed ^ accepted}"


class Transport(asyncio.Transport):
    """What the protocol writes, on a connection that stays open."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        addresses = {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}
        return addresses.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _app(scope: Any, receive: Any, send: Any) -> None:  # never reached when shed
    raise AssertionError("a shed request reached the app")


def _refuse_all(observed: list[tuple[str, int]]) -> Screener:
    def screen(headers: Headers) -> None:
        raise Overloaded("queue", "an estimated 2 s wait exceeds the 1 s left", 1)

    return Screener(
        port=8080,
        admin_port=None,
        max_body_bytes=1 << 20,
        observe=lambda route, code: observed.append((route, code)),
        screen=screen,
    )


async def _drive(requests: bytes) -> tuple[Transport, list[tuple[str, int]], bool]:
    """``requests`` through the screening protocol that refuses every scoring request: what
    it wrote, what it counted, and whether it left the connection open."""
    observed: list[tuple[str, int]] = []
    config = uvicorn.Config(_app, http="httptools", log_level="warning")
    config.load()
    cls = screening_protocol(_refuse_all(observed))
    proto = cls(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    proto.connection_made(transport)
    proto.data_received(requests)
    await asyncio.sleep(0)
    still_open = not transport.closed
    proto.connection_lost(None)
    return transport, observed, still_open


def test_a_shed_request_is_answered_whole_by_the_protocol_and_the_next_one_too() -> None:
    body = json.dumps({"user_id": "u", "candidates": {}}).encode()
    one = (
        b"POST /v1/score HTTP/1.1\r\nhost: ranker\r\ncontent-type: application/json\r\n"
        b"x-request-id: req-1\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    transport, observed, still_open = asyncio.run(_drive(one + one.replace(b"req-1", b"req-2")))
    answers = bytes(transport.written).split(b"HTTP/1.1 ")[1:]
    assert len(answers) == 2, transport.written  # the body discarded, the next one parsed
    for answer, request_id in zip(answers, (b"req-1", b"req-2"), strict=True):
        head, _, sent = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"503 Service Unavailable"), head
        assert b"\r\nretry-after: 1" in head.lower() and b"x-request-id: " + request_id in head
        assert b"content-length: " + str(len(sent)).encode() in head
        assert json.loads(sent)["request_id"] == request_id.decode()
    assert observed == [("/v1/score", 503)] * 2
    assert still_open  # keep-alive: the connection serves on
    assert issubclass(screening_protocol(_refuse_all([])), HttpToolsProtocol)
