"""The ports the test suites and tools hand their servers: never one an outgoing connection
can take first (below the kernel's ephemeral range) and never the same one twice in a
process before its server had the chance to bind it."""

from __future__ import annotations

import socket
from pathlib import Path

from kvrank.tools.processes import NODE_PORTS, free_port, free_port_pair


def test_ports_are_below_the_ephemeral_range_free_and_never_handed_out_twice() -> None:
    floor = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)
    assert max(ports) < min(floor, NODE_PORTS)
    with socket.socket() as s:  # handed out free
        s.bind(("127.0.0.1", ports[-1]))
    pairs = [free_port_pair() for _ in range(100)]
    assert max(pairs) + 10_000 < min(floor, NODE_PORTS)
    assert not {*pairs, *(p + 10_000 for p in pairs)} & set(ports)
