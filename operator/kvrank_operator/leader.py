"""Leader election on a ``coordination.k8s.io`` Lease: of all the operator's replicas,
exactly one reconciles.

Every replica runs an :class:`Election` (the Kubernetes client's ``LeaseLock`` elector, in a
thread). A follower only competes for the Lease and answers its health probe; the replica
that acquires the Lease starts reconciling. A leader that cannot renew the Lease within the
renew deadline ends its process at once — it cannot know whether another replica already
took over, so it must not write another object (the Deployment restarts it as a follower).
Because a retry period plus the renew deadline is shorter than the lease duration, the old
leader has stopped before any follower may consider the Lease expired: two replicas never
reconcile at once.
A leader that stops cleanly (its pod deleted, its node drained) hands the Lease back, so a
follower takes over at once instead of after a lease duration.

This module must not reconcile or touch any object but its Lease.
"""

from __future__ import annotations

import datetime as dt
import http.server
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from kvrank_operator.metrics import OperatorMetrics

log = logging.getLogger("kvrank_operator.leader")
LEASE_LOST_EXIT_CODE = 3
"""Exit status of a leader that lost its Lease (the pod restarts and rejoins as a follower)."""


def default_identity() -> str:
    """``<pod name>_<random>``: the holder in the Lease says which pod leads, and a restarted
    container never mistakes its predecessor's Lease for its own."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class ElectionSettings:
    """Who competes for which Lease, and its timing (client-go's defaults, which every
    Kubernetes controller uses: fail-over within ~15 s at one Lease write per 2 s)."""

    lease: str
    """Name of the Lease; every replica of one operator uses the same."""
    namespace: str
    """Namespace of the Lease (the operator's own)."""
    identity: str = field(default_factory=default_identity)
    """This replica's holder identity."""
    lease_duration_s: int = 15
    """How long followers wait, after the last renewal they saw, before taking the Lease."""
    renew_deadline_s: int = 10
    """How long the leader keeps retrying a failed renewal before it gives up (and exits).
    Shorter than ``lease_duration_s``: the leader has stopped before a follower takes over."""
    retry_period_s: int = 2
    """Between renewals (leader) and between attempts to acquire (followers)."""

    def __post_init__(self) -> None:
        # the leader's last renewal may be followed by one retry period and a whole renew
        # deadline before it gives up: all of that must fit in the lease duration
        if self.retry_period_s + self.renew_deadline_s >= self.lease_duration_s:
            raise ValueError(
                f"lease_duration_s ({self.lease_duration_s}) must exceed renew_deadline_s"
                f" + retry_period_s ({self.renew_deadline_s} + {self.retry_period_s})"
            )


class _Lease(LeaseLock):  # type: ignore[misc]
    """The client's ``LeaseLock`` that can be closed: once this replica hands the Lease back,
    its elector thread (which the client cannot stop) must not renew or retake it."""

    closed = False

    def create(self, name: str, namespace: str, election_record: object) -> bool:
        return not self.closed and bool(super().create(name, namespace, election_record))

    def update(self, name: str, namespace: str, updated_record: object) -> bool:
        return not self.closed and bool(super().update(name, namespace, updated_record))


class Election:
    """One replica's part in the election. ``start()`` runs it in a daemon thread;
    ``elected`` is set once this replica leads; ``alive()`` is what the health probe reports
    while following."""

    def __init__(
        self,
        settings: ElectionSettings,
        api: client.ApiClient,
        on_lost: Callable[[str], None] | None = None,
        metrics: OperatorMetrics | None = None,
    ) -> None:
        """``on_lost(why)`` runs when this replica led and can no longer be sure it does;
        by default it ends the process. ``metrics.leader`` says whether it leads."""
        self.settings = settings
        self._leading = (metrics or OperatorMetrics.create()).leader
        self._on_lost = on_lost or end_process
        self.elected = threading.Event()
        self._coordination = client.CoordinationV1Api(api)
        self._lock = _Lease(settings.lease, settings.namespace, settings.identity)
        self._lock.api_instance = self._coordination  # this client, not the global default
        self._elector = leaderelection.LeaderElection(
            electionconfig.Config(
                self._lock,
                lease_duration=settings.lease_duration_s,
                renew_deadline=settings.renew_deadline_s,
                retry_period=settings.retry_period_s,
                onstarted_leading=self._started_leading,
                onstopped_leading=self._stopped_leading,
            )
        )
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._leading.set(0)

    def start(self) -> Election:
        log.info(
            "competing for Lease %s/%s as %s",
            self.settings.namespace,
            self.settings.lease,
            self.settings.identity,
        )
        self._thread.start()
        return self

    def alive(self) -> bool:
        return self._thread.is_alive()

    def release(self) -> None:
        """Hand the Lease back (after this replica stopped reconciling), so a follower takes
        over now rather than after ``lease_duration_s``."""
        if not self.elected.is_set():
            return
        self._lock.closed = True
        try:
            lease = self._coordination.read_namespaced_lease(
                self.settings.lease, self.settings.namespace
            )
            if lease.spec is None or lease.spec.holder_identity != self.settings.identity:
                return
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = dt.datetime.now(dt.UTC)
            self._coordination.replace_namespaced_lease(
                self.settings.lease, self.settings.namespace, lease
            )
            log.info("Lease %s handed back", self.settings.lease)
        except ApiException as exc:
            log.warning("could not hand the Lease back (%s %s)", exc.status, exc.reason)
        finally:
            self._leading.set(0)

    def _started_leading(self) -> None:
        log.info("leading as %s", self.settings.identity)
        self._leading.set(1)
        self.elected.set()

    def _stopped_leading(self) -> None:
        self._on_lost(f"could not renew the Lease within {self.settings.renew_deadline_s}s")

    def _run(self) -> None:
        try:
            self._elector.run()  # returns (after ``_stopped_leading``) only once leadership ends
        except Exception:
            log.exception("leader election failed")
            if self.elected.is_set() and not self._lock.closed:
                self._on_lost("leader election failed")


def end_process(why: str) -> None:
    """What a leader does when it lost the Lease: end at once, without clean-up, so not one
    more write leaves this replica (its Deployment restarts it as a follower)."""
    log.critical("%s: stopping so that only the new leader reconciles", why)
    logging.shutdown()
    os._exit(LEASE_LOST_EXIT_CODE)


class FollowerHealth:
    """``/healthz`` of a replica that is not leading (kopf serves it once this one leads):
    200 while its election thread runs, so a follower whose election died is restarted."""

    def __init__(self, port: int, election: Election) -> None:
        def check(handler: http.server.BaseHTTPRequestHandler) -> None:
            ok = handler.path.split("?")[0] == "/healthz" and election.alive()
            handler.send_response(200 if ok else 503)
            handler.send_header("Content-Type", "text/plain")
            handler.end_headers()
            handler.wfile.write(b"following\n" if ok else b"no election\n")

        handler = type(
            "Handler",
            (http.server.BaseHTTPRequestHandler,),
            {"do_GET": check, "log_message": lambda *_: None},
        )
        self._server = http.server.ThreadingHTTPServer(("0.0.0.0", port), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FollowerHealth:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Free the port for kopf's liveness endpoint."""
        self._server.shutdown()
        self._server.server_close()
