"""Day-2 care of a managed Redis Cluster: observe its real state, heal what pods cannot.

A managed Redis pod keeps its cluster identity in ``/data/nodes.conf`` on an ``emptyDir``:
when a pod is deleted or evicted, the StatefulSet brings it back *empty*, under a new node
id, knowing nobody. Redis does not repair that by itself: the old id lingers as ``fail`` in
every peer's table, the new node stays alone, and (without a replica to fail over to) the
old master's slots stay uncovered, so ``cluster_state`` is ``fail`` for every key.

:func:`inspect` reads the cluster as its nodes see it; :func:`heal` takes one step towards
health per call (the operator calls it on every resync, so it converges level-based):

1. a reachable node unknown to the cluster is introduced (``CLUSTER MEET``);
2. once Redis has promoted the replicas of lost masters (it does so by itself), ids of
   nodes that are gone (``fail``/``noaddr``, or addressed to no current pod) are forgotten
   on every node (``CLUSTER FORGET``; within Redis' 60 s ban, so gossip does not
   bring them back);
3. slots no live master serves are given to an empty master (``CLUSTER ADDSLOTSRANGE``) —
   the restarted pod takes its slots back (their keys were lost with the pod: a cache);
4. an empty master left over once every slot is served becomes a replica of the master
   with the fewest replicas (``CLUSTER REPLICATE``).

Nodes are addressed as ``ip:port`` (the operator lists the pods); any Redis error on one
node makes that node unreachable for this round, never an exception for the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

SLOTS = 16384
PORT = 6379


class RedisNode(Protocol):
    """The few commands used here (``redis.Redis`` satisfies it)."""

    def execute_command(self, *args: Any) -> Any: ...


@dataclass(frozen=True)
class Peer:
    """One line of ``CLUSTER NODES``."""

    node_id: str
    addr: str
    """``ip:port`` (without the bus port)."""
    flags: frozenset[str]
    master_id: str | None
    slots: tuple[tuple[int, int], ...]

    @property
    def gone(self) -> bool:
        return bool(self.flags & {"fail", "noaddr", "handshake"}) and "myself" not in self.flags

    @property
    def is_master(self) -> bool:
        return "master" in self.flags


@dataclass
class NodeView:
    addr: str
    node_id: str
    state_ok: bool
    peers: list[Peer]

    def me(self) -> Peer:
        return next(p for p in self.peers if "myself" in p.flags)


@dataclass(frozen=True)
class AclUser:
    """A Redis user every node must have (``ACL SETUSER name reset on >password rules``)."""

    name: str
    password: str
    rules: tuple[str, ...]


@dataclass
class Health:
    ok: bool
    reason: str
    message: str
    actions: list[str] = field(default_factory=list)


def parse_nodes(text: str) -> list[Peer]:
    peers = []
    for line in text.strip().splitlines():
        cols = line.split()
        if len(cols) < 8:
            continue
        addr = cols[1].split("@")[0]
        slots = []
        for token in cols[8:]:
            if token.startswith("["):  # a slot being migrated/imported
                continue
            lo, _, hi = token.partition("-")
            slots.append((int(lo), int(hi or lo)))
        peers.append(
            Peer(
                node_id=cols[0],
                addr=addr,
                flags=frozenset(cols[2].split(",")),
                master_id=None if cols[3] == "-" else cols[3],
                slots=tuple(slots),
            )
        )
    return peers


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def observe(
    addrs: Iterable[str], connect: Callable[[str], RedisNode]
) -> dict[str, NodeView | None]:
    """Each node's view of the cluster, or None when the node does not answer."""
    views: dict[str, NodeView | None] = {}
    for addr in addrs:
        try:
            node = connect(addr)
            info = _text(node.execute_command("CLUSTER", "INFO"))
            peers = parse_nodes(_text(node.execute_command("CLUSTER", "NODES")))
        except Exception:
            views[addr] = None
            continue
        me = next((p for p in peers if "myself" in p.flags), None)
        if me is None:
            views[addr] = None
            continue
        views[addr] = NodeView(addr, me.node_id, "cluster_state:ok" in info, peers)
    return views


def _anchor(views: dict[str, NodeView | None]) -> NodeView | None:
    """The node that sees the most of the cluster: the one the others are joined to."""
    live = [v for v in views.values() if v is not None]
    if not live:
        return None
    return max(live, key=lambda v: (sum(_width(p) for p in v.peers if not p.gone), len(v.peers)))


def _width(p: Peer) -> int:
    return sum(hi - lo + 1 for lo, hi in p.slots)


def inspect(
    views: dict[str, NodeView | None], expected: int, replicas_per_shard: int = 0
) -> Health:
    """Whether the cluster serves every slot with ``expected`` healthy nodes, and if not why."""
    down = sorted(addr for addr, v in views.items() if v is None)
    if len(views) < expected:
        return Health(False, "NodesMissing", f"{len(views)}/{expected} Redis pods have an IP")
    if down:
        return Health(False, "NodesUnreachable", f"no answer from {', '.join(down)}")
    anchor = _anchor(views)
    assert anchor is not None
    gone = _gone(anchor, views)
    members = [p for p in anchor.peers if p not in gone]
    covered = sum(_width(p) for p in members if p.is_master)
    if covered < SLOTS:
        return Health(
            False, "SlotsUncovered", f"{SLOTS - covered} of {SLOTS} slots have no live master"
        )
    if gone:
        return Health(False, "NodesFailed", f"{len(gone)} failed node id(s) still in the cluster")
    if len(members) < expected:
        return Health(False, "NodesNotJoined", f"{len(members)}/{expected} nodes in the cluster")
    idle = [p.addr for p in members if p.is_master and not p.slots]
    if idle and replicas_per_shard > 0:
        return Health(False, "ReplicasMissing", f"{', '.join(idle)} serve no slot and no master")
    not_ok = sorted(v.addr for v in views.values() if v is not None and not v.state_ok)
    if not_ok:
        return Health(False, "StateNotOk", f"cluster_state is not ok on {', '.join(not_ok)}")
    return Health(True, "ClusterOk", f"{expected} nodes, all {SLOTS} slots served")


def heal(
    views: dict[str, NodeView | None], connect: Callable[[str], RedisNode], replicas_per_shard: int
) -> list[str]:
    """One repair step (see the module docstring); the actions taken, as sentences."""
    anchor = _anchor(views)
    if anchor is None:
        return []
    known = {p.node_id for p in anchor.peers}
    strangers = [v for v in views.values() if v is not None and v.node_id not in known]
    if strangers:
        for v in strangers:
            ip, port = v.addr.rsplit(":", 1)
            connect(anchor.addr).execute_command("CLUSTER", "MEET", ip, int(port))
        return [f"introduced {v.addr} ({v.node_id[:8]}) to the cluster" for v in strangers]
    gone = _gone(anchor, views)
    if _failover_pending(views):
        return []  # a replica of a lost master: Redis promotes it by itself; wait for that
    reachable = [v for v in views.values() if v is not None]
    if gone and len(reachable) == len(views):
        for node in reachable:
            for p in gone:
                if p.node_id != node.node_id:
                    _try(connect(node.addr), "CLUSTER", "FORGET", p.node_id)
        return [f"forgot node {p.node_id[:8]} ({p.addr}), which is gone" for p in gone]
    live = [p for p in anchor.peers if not p.gone]
    served = [False] * SLOTS
    for p in live:
        if p.is_master:
            for lo, hi in p.slots:
                served[lo : hi + 1] = [True] * (hi - lo + 1)
    empty = [p for p in live if p.is_master and not p.slots]
    holes = _ranges(i for i, s in enumerate(served) if not s)
    if holes and empty:
        target = empty[0]
        args: list[Any] = ["CLUSTER", "ADDSLOTSRANGE"]
        for lo, hi in holes:
            args += [lo, hi]
        connect(target.addr).execute_command(*args)
        return [f"gave {SLOTS - sum(served)} uncovered slots to {target.addr}"]
    if not holes and empty and replicas_per_shard > 0:
        masters = [p for p in live if p.is_master and p.slots]
        count = {m.node_id: sum(1 for p in live if p.master_id == m.node_id) for m in masters}
        target_master = min(masters, key=lambda m: count[m.node_id])
        connect(empty[0].addr).execute_command("CLUSTER", "REPLICATE", target_master.node_id)
        return [f"made {empty[0].addr} a replica of {target_master.addr}"]
    return []


def _gone(anchor: NodeView, views: dict[str, NodeView | None]) -> list[Peer]:
    """Peers that failed, or whose address is no current pod's (a re-created pod has a new
    IP): their ids must go."""
    return [p for p in anchor.peers if p.gone or ("myself" not in p.flags and p.addr not in views)]


def _failover_pending(views: dict[str, NodeView | None]) -> bool:
    """Some node is still the replica of a lost master that holds slots (in any node's view:
    forgetting that master now would leave the replica unable to win its election)."""
    for v in views.values():
        if v is None:
            continue
        me = v.me()
        master = next((p for p in v.peers if p.node_id == me.master_id), None)
        if master is not None and master.slots and (master.gone or master.addr not in views):
            return True
    return False


def _try(node: RedisNode, *args: Any) -> None:
    try:
        node.execute_command(*args)
    except Exception:
        return


def set_users(
    addrs: list[str], users: Sequence[AclUser], connect: Callable[[str], RedisNode]
) -> list[str]:
    """Each of ``users`` as it must be on each node at ``addrs``, every time (its rules
    replaced whole, in one command: connections it has authenticated keep working); what
    was created. A node that fails this is left for the next round."""
    created = []
    for addr in addrs:
        node = connect(addr)
        for user in users:
            try:
                existed = node.execute_command("ACL", "GETUSER", user.name) is not None
                node.execute_command(
                    "ACL", "SETUSER", user.name, "reset", "on", f">{user.password}", *user.rules
                )
            except Exception:
                continue
            if not existed:
                created.append(f"created ACL user {user.name!r} on {addr}")
    return created


def _ranges(indexes: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for i in indexes:
        if out and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def check_and_heal(
    addrs: list[str],
    password: str | None,
    expected: int,
    replicas_per_shard: int,
    tls_ca: str | None = None,
    users: Sequence[AclUser] = (),
) -> Health:
    """Observe the cluster at ``addrs`` (``ip:port``), take one healing step when it is
    unhealthy, and report its health as observed before that step. ``tls_ca``: the nodes
    speak TLS with certificates of this CA (PEM; the chain is checked, not the IP, which
    no certificate names). ``users``: set on every node that answers (ACLs are per node and
    a node back from a restart has none), each one created is an action."""
    import redis

    clients: dict[str, redis.Redis] = {}

    def connect(addr: str) -> RedisNode:
        if addr not in clients:
            host, port = addr.rsplit(":", 1)
            clients[addr] = redis.Redis(
                host=host,
                port=int(port),
                password=password,
                socket_timeout=2,
                socket_connect_timeout=2,
                ssl=tls_ca is not None,
                ssl_ca_data=tls_ca,
                ssl_check_hostname=False,  # pod IPs: see kvrank_operator.certs
            )
        return clients[addr]

    try:
        views = observe(addrs, connect)
        health = inspect(views, expected, replicas_per_shard)
        created = set_users([addr for addr, v in views.items() if v is not None], users, connect)
        # a pod without an address may still be a member: never heal around it
        if not health.ok and health.reason != "NodesMissing":
            try:
                health.actions = heal(views, connect, replicas_per_shard)
            except Exception as exc:
                health.actions = [f"healing step failed: {exc}"]
        health.actions += created
        return health
    finally:
        for c in clients.values():
            c.close()
