"""A real ``kvrank serve`` behind the queue proxy (the stock Envoy binary, run from the
operator's own bootstrap) bounded to one request at a time: the queue-proxy tests' fixture."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from bench_overload_front import Front

from kvrank.model.artifact import save_model
from kvrank.model.config import ModelConfig
from kvrank.model.ranker import RankerModel
from kvrank.tools.processes import RankerProcess, free_port


@contextlib.contextmanager
def proxied_ranker(
    workdir: Path, config: ModelConfig, *, grpc: bool = False, env: dict[str, str] | None = None
) -> Iterator[tuple[RankerProcess, Front]]:
    """The ranker (serving gRPC too with ``grpc``) and its proxy, both stopped after."""
    torch.manual_seed(0)
    model = save_model(RankerModel(config, "v1").eval(), workdir / "v1")
    grpc_port = free_port() if grpc else None
    args = ("--grpc-port", str(grpc_port)) if grpc_port is not None else ()
    ranker = RankerProcess.start(model, workdir, *args, env=env)
    front = Front(workdir, ranker, limit=1, grpc_upstream=grpc_port)
    try:
        front.start()
        yield ranker, front
    finally:
        front.stop()
        ranker.stop()
