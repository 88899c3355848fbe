"""Local processes for the demo, the load test and the test suites.

:class:`RedisServer` is one private ``redis-server`` on loopback (standalone or a Cluster
node); :func:`start_redis_cluster` makes a real Redis Cluster of them. :class:`RankerProcess`
is one ``kvrank serve`` (the test suites' and the tools' one launcher). :class:`ProcessStack`
is the demo's serving stack: a redis-server when the binary is installed (otherwise the
stack runs L1-only and says so) and any number of rankers; everything is stopped on exit,
even on errors.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")


def wait_for(
    cond: Callable[[], T],
    what: str,
    timeout: float,
    report: Callable[[], str] | None = None,
    interval: float = 0.3,
) -> T:
    """Poll ``cond`` until it returns something truthy, and return that.

    On timeout, fail with ``what`` and whatever ``report`` says (component logs, objects):
    a wait that fails explains itself. Every wait in the test suites goes through here.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            details = f"\n{report()}" if report is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{details}")
        time.sleep(interval)


def samples(text: str, name: str, **labels: str) -> list[float]:
    """Every sample called ``name`` that carries ``labels``, in Prometheus text exposition."""
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    ]


def scrape(url: str, name: str, **labels: str) -> float:
    """The sum of ``name`` (with ``labels``) on a server's ``/metrics``."""
    return sum(samples(httpx.get(f"{url}/metrics", timeout=10).text, name, **labels))


LOWEST_PORT = 11_000
"""Where the ports handed out here start: above the ports services usually own, Kubernetes'
node components' defaults (10248-10260: a kube-proxy in the local node keeps its own)
included."""
NODE_PORTS = 30_000
"""Where Kubernetes' NodePort range starts (the local cluster's kube-proxy may hold those):
the ports handed out here stay below it too."""
_handed_out: set[int] = set()
"""Ports this process handed out already: not handed out again (their servers may not have
bound them yet)."""
_handing_out = threading.Lock()


@functools.cache
def _ephemeral_floor() -> int:
    """The lowest port the kernel gives outgoing connections (``ip_local_port_range``), read
    once: a setting of the machine, not of the moment."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _free_ports(offsets: tuple[int, ...]) -> int:
    """A random port p, free on loopback with p + each offset, all below the kernel's
    ephemeral range (and the NodePorts). A port the kernel handed out (``bind(0)``) and
    released is in that range, and any outgoing connection on the machine may take it as its
    local port before the server meant to bind it does ("address already in use", seen with
    a busy test run beside); below the range only another caller of this could, and the
    random choice keeps two of them apart."""
    top = min(_ephemeral_floor(), NODE_PORTS) - 1 - max(offsets)
    if top <= LOWEST_PORT:
        raise RuntimeError(f"no ports below the ephemeral range ({top + max(offsets) + 1})")
    with _handing_out:
        if len(_handed_out) > 4096:  # handed out long ago: bound by now, or never to be
            _handed_out.clear()
        for _ in range(200):
            port = random.randint(LOWEST_PORT, top)
            wanted = {port + offset for offset in offsets}
            if wanted & _handed_out:
                continue
            sockets = [socket.socket() for _ in offsets]
            try:
                for s, taken in zip(sockets, sorted(wanted), strict=True):
                    s.bind(("127.0.0.1", taken))
            except OSError:
                continue
            finally:
                for s in sockets:
                    s.close()
            _handed_out.update(wanted)
            return port
    raise RuntimeError("no free port found below the ephemeral range")


def free_port() -> int:
    """A free TCP port on loopback for a server to bind (see :func:`_free_ports`)."""
    return _free_ports((0,))


def free_port_pair() -> int:
    """A free port p with p + 10000 free too (Redis Cluster's bus port)."""
    return _free_ports((0, 10_000))


@dataclass
class RedisServer:
    """One redis-server on loopback; ``stop``/``start`` simulate an outage (a Cluster node
    keeps its ``nodes.conf`` in ``workdir``, so a restarted node rejoins its cluster)."""

    port: int
    workdir: Path
    cluster: bool = False
    password: str | None = None
    conf: str = ""
    """Directives loaded before the command line's (which win)."""
    tls_ca: Path | None = None
    """Serve TLS only (the certificates come with ``conf``); clients trust this CA."""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls_ca else 'redis'}://127.0.0.1:{self.port}"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (`make services` installs it)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "redis.conf"
        conf.write_text(self.conf)
        ports = ["--port", "0", "--tls-port", str(self.port)] if self.tls_ca else []
        args = [
            binary,
            str(conf),
            "--port",
            str(self.port),
            *ports,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            "--protected-mode",
            "yes",
            "--logfile",
            str(self.workdir / "redis.log"),
        ]
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        if self.cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(self.workdir / "nodes.conf"),
                "--cluster-node-timeout",
                "2000",
            ]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.cli("ping").stdout.strip() == "PONG":
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server on {self.port} did not start: {self.workdir}/redis.log")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                "redis-cli",
                *(["--tls", "--cacert", str(self.tls_ca)] if self.tls_ca else []),
                "-p",
                str(self.port),
                *(["-a", self.password, "--no-auth-warning"] if self.password else []),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )


@dataclass
class PrometheusServer:
    """Debian's ``prometheus`` on loopback with a given configuration (scrape jobs, rule
    files); ``query`` and ``alerts`` read its HTTP API."""

    workdir: Path
    config: dict[str, Any]
    port: int = field(default_factory=lambda: free_port())
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed (`make services` installs it)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "prometheus.yml"
        conf.write_text(json.dumps(self.config))  # JSON is YAML
        with (self.workdir / "prometheus.log").open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={conf}",
                    f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not start: {self.workdir}/prometheus.log")
            time.sleep(0.2)
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now (``/api/v1/alerts``)."""
        with urllib.request.urlopen(f"{self.url}/api/v1/alerts", timeout=5) as resp:
            found: list[dict[str, Any]] = json.loads(resp.read())["data"]["alerts"]
        return found

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None


@dataclass
class RedisCluster:
    nodes: list[RedisServer]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def flush(self) -> None:
        for n in self.nodes:
            n.cli("flushall")

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def wait_ok(self, timeout: float = 20.0) -> None:
        """Until every running node reports ``cluster_state:ok``."""
        deadline = time.monotonic() + timeout
        while not all(
            "cluster_state:ok" in n.cli("cluster", "info").stdout
            for n in self.nodes
            if n.proc is not None
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("redis cluster did not reach cluster_state:ok")
            time.sleep(0.1)


def start_redis_cluster(workdir: Path, masters: int = 3) -> RedisCluster:
    """A real Redis Cluster of ``masters`` redis-servers (no replicas) on loopback."""
    cluster = RedisCluster([])
    try:
        for i in range(masters):
            node = RedisServer(free_port_pair(), workdir / f"n{i}", cluster=True)
            cluster.nodes.append(node.start())
        out = subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *[f"127.0.0.1:{n.port}" for n in cluster.nodes],
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout}{out.stderr}")
        cluster.wait_ok()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def wait_answering(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    """Returns once ``url`` answers 200; raises, with the end of ``log``, when ``proc``
    exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"no 200 from {url} within {timeout_s:g} s: {log.read_text()[-3000:]}")


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; returns once it has exited."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class RankerProcess:
    """One real ``kvrank serve`` on loopback; :meth:`start` returns once it is ready.

    It stops without a drain delay (``KVRANK_DRAIN_DELAY_S=0`` unless ``env`` says
    otherwise): a pod keeps serving for a while after SIGTERM because its Service's endpoints
    lag behind, and nothing routes to a process on loopback that way. Requests in flight
    still finish."""

    url: str
    port: int
    log: Path
    """Its stdout and stderr."""
    proc: subprocess.Popen[bytes]

    @classmethod
    def start(
        cls,
        model: Path,
        workdir: Path,
        *args: str,
        env: dict[str, str] | None = None,
        timeout_s: float = 120.0,
    ) -> RankerProcess:
        port = free_port()
        log = workdir / f"ranker-{port}.log"
        cmd = [
            str(Path(sys.executable).parent / "kvrank"),
            "serve",
            "--model",
            str(model),
            "--port",
            str(port),
            *args,
        ]
        with log.open("wb") as out:
            settings = {**os.environ, "KVRANK_DRAIN_DELAY_S": "0", **(env or {})}
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=settings)
        ranker = cls(f"http://127.0.0.1:{port}", port, log, proc)
        try:
            ranker._wait_ready(timeout_s)
        except BaseException:
            ranker.stop()
            raise
        return ranker

    def _wait_ready(self, timeout_s: float) -> None:
        wait_answering(f"{self.url}/readyz", self.proc, self.log, timeout_s)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of every sample called ``name`` that carries ``labels``."""
        return scrape(self.url, name, **labels)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        stop_process(self.proc)


@dataclass
class ProcessStack:
    workdir: Path
    rankers: list[RankerProcess] = field(default_factory=list)
    redis_url: str | None = None
    _exit: ExitStack = field(default_factory=ExitStack)

    def __enter__(self) -> ProcessStack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc: object) -> None:
        for r in reversed(self.rankers):
            r.proc.terminate()  # all at once: each then has its own grace period
        for r in reversed(self.rankers):
            r.stop()
        self._exit.close()

    def start_redis(self) -> str | None:
        if shutil.which("redis-server") is None:
            return None
        server = RedisServer(free_port_pair(), self.workdir / "redis").start()
        self._exit.callback(server.stop)
        self.redis_url = server.url
        return self.redis_url

    def start_ranker(self, model: Path, *args: str, env: dict[str, str] | None = None) -> str:
        """A ranker serving ``model`` (ready); its URL."""
        ranker = RankerProcess.start(model, self.workdir, *args, env=env)
        self.rankers.append(ranker)
        return ranker.url
