"""Shared factories for the data-plane tests: random users/candidates and models whose
logits are O(1) (default init gives tiny logits, which would make exactness tests vacuous)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from kvrank.model.config import ModelConfig
from kvrank.model.inputs import Candidates, Events, UserFeatures
from kvrank.model.ranker import RankerModel


@dataclass(frozen=True)
class Factory:
    """Builds inputs and models from a seed, so failures are reproducible."""

    def events(self, cfg: ModelConfig, n: int, seed: int) -> Events:
        g = torch.Generator().manual_seed(seed)
        return Events(
            torch.randint(0, 2**62, (n,), generator=g),
            torch.randint(0, cfg.n_categories, (n,), generator=g),
            torch.randint(0, cfg.n_actions, (n,), generator=g),
            torch.randint(0, cfg.n_gap_buckets, (n,), generator=g),
            torch.randn(n, cfg.event_dense, generator=g),
        )

    def user(self, cfg: ModelConfig, n: int, seed: int) -> UserFeatures:
        g = torch.Generator().manual_seed(seed + 1)
        return UserFeatures(
            self.events(cfg, n, seed),
            torch.randint(0, 2**40, (cfg.profile_fields,), generator=g),
            torch.randint(0, 2**40, (cfg.context_fields,), generator=g),
            torch.randn(cfg.user_dense, generator=g),
        )

    def candidates(self, cfg: ModelConfig, c: int, seed: int) -> Candidates:
        g = torch.Generator().manual_seed(seed + 2)
        return Candidates(
            torch.randint(0, 2**62, (c,), generator=g),
            torch.randint(0, cfg.n_categories, (c,), generator=g),
            torch.randn(c, cfg.cand_dense, generator=g),
        )

    def model(self, cfg: ModelConfig, seed: int = 0, version: str = "test") -> RankerModel:
        torch.manual_seed(seed)
        model = RankerModel(cfg, version)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() >= 2 and "embed" not in name:
                    p.normal_(0.0, 1.0 / p.shape[-2] ** 0.5)
        return model.eval()


FACTORY = Factory()


@pytest.fixture(scope="session")
def factory() -> Factory:
    return FACTORY


@pytest.fixture(scope="session")
def tiny_cfg() -> ModelConfig:
    return ModelConfig(
        d_model=32,
        n_heads=4,
        n_layers=3,
        max_events=24,
        ns_tokens=2,
        cand_tokens=4,
        item_buckets=1000,
        profile_buckets=500,
        n_categories=16,
        emb_dim=8,
    )


# --------------------------------------------------------------------------- Redis
# Real redis-server processes on free loopback ports (make test installs the binary).

import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402


def _free_port() -> int:
    """A free port p with p + 10000 free too (Redis Cluster's bus port), both <= 65535."""
    import random

    for _ in range(200):
        port = random.randint(20_000, 55_000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10_000))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair found")


@dataclass
class RedisProcess:
    """One redis-server on loopback; ``stop``/``start`` simulate an outage."""

    port: int
    workdir: Path
    cluster: bool = False
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> RedisProcess:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (make test installs it)"
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [
            binary,
            "--port",
            str(self.port),
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
        ]
        if self.cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(self.workdir / "nodes.conf"),
                "--cluster-node-timeout",
                "2000",
            ]
        args += ["--logfile", str(self.workdir / "redis.log")]
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
            ["redis-cli", "-p", str(self.port), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    server = RedisProcess(_free_port(), tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@dataclass
class RedisClusterProcesses:
    nodes: list[RedisProcess]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def flush(self) -> None:
        for n in self.nodes:
            n.cli("flushall")


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcesses]:
    base = tmp_path_factory.mktemp("redis-cluster")
    nodes: list[RedisProcess] = []
    try:
        for i in range(3):
            nodes.append(RedisProcess(_free_port(), base / f"n{i}", cluster=True).start())
        out = subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *[f"127.0.0.1:{n.port}" for n in nodes],
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        deadline = time.monotonic() + 20
        while "cluster_state:ok" not in nodes[0].cli("cluster", "info").stdout:
            assert time.monotonic() < deadline, "redis cluster did not become ok"
            time.sleep(0.1)
        yield RedisClusterProcesses(nodes)
    finally:
        for n in nodes:
            n.stop()


@pytest.fixture
def spawn_redis(tmp_path: Path) -> Iterator[Callable[[], RedisProcess]]:
    """Start private redis-servers (for outage tests); all are stopped afterwards."""
    started: list[RedisProcess] = []

    def spawn() -> RedisProcess:
        server = RedisProcess(_free_port(), tmp_path / f"redis-{len(started)}").start()
        started.append(server)
        return server

    yield spawn
    for s in started:
        s.stop()
