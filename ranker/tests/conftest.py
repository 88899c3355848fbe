"""Shared factories for the data-plane tests: random users/candidates and models whose
logits are O(1) (default init gives tiny logits, which would make exactness tests vacuous)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kvrank.cache import SequenceChain, sequence_chain
from kvrank.model.config import TINY, ModelConfig
from kvrank.model.inputs import Candidates, Events, UserFeatures
from kvrank.model.onetrans import feature_spec, from_features
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

    def chain(self, user: UserFeatures, fingerprint: str, cfg: ModelConfig) -> SequenceChain:
        """The sequence hash chain the server computes for a built-in model's user."""
        return sequence_chain(from_features(user), fingerprint, feature_spec(cfg))

    def model(self, cfg: ModelConfig, seed: int = 0, version: str = "test") -> RankerModel:
        torch.manual_seed(seed)
        model = RankerModel(cfg, version)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() >= 2 and "embed" not in name:
                    p.normal_(0.0, 1.0 / p.shape[-2] ** 0.5)
        return model.eval()


FACTORY = Factory()


def run_kvrank(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``kvrank ARGS`` as a user runs it (this environment's entry point); asserts it exits
    0 and shows the end of its output when it does not."""
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "kvrank"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="session")
def kvrank_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """:func:`run_kvrank`, for the tests that drive the command line."""
    return run_kvrank


@pytest.fixture(scope="session")
def factory() -> Factory:
    return FACTORY


@pytest.fixture(scope="session")
def tiny_cfg() -> ModelConfig:
    return TINY


# --------------------------------------------------------------------------- Redis
# Real redis-server processes on free loopback ports (make test installs the binary).

from collections.abc import Iterator  # noqa: E402

from kvrank.tools.processes import RedisCluster, free_port_pair, start_redis_cluster  # noqa: E402
from kvrank.tools.processes import RedisServer as RedisProcess  # noqa: E402


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    server = RedisProcess(free_port_pair(), tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    cluster = start_redis_cluster(tmp_path_factory.mktemp("redis-cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture
def spawn_redis(tmp_path: Path) -> Iterator[Callable[[], RedisProcess]]:
    """Start private redis-servers (for outage tests); all are stopped afterwards."""
    started: list[RedisProcess] = []

    def spawn() -> RedisProcess:
        server = RedisProcess(free_port_pair(), tmp_path / f"redis-{len(started)}").start()
        started.append(server)
        return server

    yield spawn
    for s in started:
        s.stop()


# --------------------------------------------------------------------------- plugins
import model_plugins  # noqa: E402


@pytest.fixture(scope="session")
def broken_plugins() -> dict[str, tuple[type, str]]:
    """The deliberately broken architectures, registered in this process."""
    model_plugins.register_broken()
    return model_plugins.BROKEN


@pytest.fixture(scope="session")
def sasrec_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_plugins.save_sasrec(tmp_path_factory.mktemp("sasrec") / "m")


@pytest.fixture(scope="session")
def sasrec_tail_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example plugin with positions from the newest event: it cannot extend."""
    return model_plugins.save_sasrec(
        tmp_path_factory.mktemp("sasrec-tail") / "m", positions="from_newest"
    )
