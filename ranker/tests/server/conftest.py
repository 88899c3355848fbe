"""Fixtures for the HTTP tests: a small saved model, request bodies, in-process apps and
real `kvrank serve` processes."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kvrank.model.artifact import save_model
from kvrank.model.config import TINY, ModelConfig
from kvrank.model.inputs import Candidates, UserFeatures
from kvrank.server.app import create_app
from kvrank.server.config import load_config
from kvrank.tools.processes import RankerProcess
from kvrank.tools.workload import request_body

SERVER_CFG = TINY


@pytest.fixture(autouse=True)
def no_server_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The servers under test read only what a test gives them, never the runner's env."""
    for name in list(os.environ):
        if name.startswith("KVRANK_"):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def artifact(tmp_path_factory, factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "m"
    save_model(factory.model(SERVER_CFG, seed=3, version="v1"), path)
    return path


body = request_body


@pytest.fixture
def make_client(artifact) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def make(**overrides: Any) -> TestClient:
        cfg = load_config({"model_dir": str(artifact), **overrides})
        client = TestClient(create_app(cfg))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.__exit__(None, None, None)


@pytest.fixture
def spawn_server(artifact, tmp_path) -> Iterator[Callable[..., RankerProcess]]:
    servers: list[RankerProcess] = []

    def spawn(
        *args: str, env: dict[str, str] | None = None, artifact: Path = artifact
    ) -> RankerProcess:
        # ready within 3 minutes: a loaded machine's startup is slow, not wrong
        s = RankerProcess.start(artifact, tmp_path, *args, env=env, timeout_s=180)
        servers.append(s)
        return s

    yield spawn
    for s in servers:
        s.stop()


@pytest.fixture(scope="session")
def server_cfg() -> ModelConfig:
    return SERVER_CFG


@pytest.fixture(scope="session")
def make_body() -> Callable[[str, UserFeatures, Candidates], dict[str, Any]]:
    return body


@pytest.fixture
def request_for(factory, server_cfg, make_body):
    """``(user, candidates, request body)`` for ``user_id``."""

    def make(user_id: str = "u1", n: int = 10, c: int = 6, seed: int = 1):
        user = factory.user(server_cfg, n, seed)
        cands = factory.candidates(server_cfg, c, seed)
        return user, cands, make_body(user_id, user, cands)

    return make
