"""kvrank's front against Triton Inference Server's, the same engine behind both, side by
side in one run.

Which front should a ranker pod run: ``kvrank serve``'s own (uvicorn and grpc.aio, the v2
protocol parsed in Python, continuous batching in the service), or Triton's (C++ HTTP and
gRPC servers and its dynamic batcher, off Python's interpreter lock) with kvrank's engine as
a Python-backend model (``benchmarks/triton_engine.py``: the same ``RankingService``, L1 and
continuous batching)? For each model size (``--sizes``) one seed-fixed artifact is served by

- ``kvrank``: ``kvrank serve`` (one torch thread, 1 GiB of L1, an hour's TTL) with its v2
  HTTP and gRPC services;
- ``triton``: ``tritonserver`` 2.51 (from the ``nvidia-pytriton`` wheel,
  ``scripts/fetch-triton.sh``) with the engine as its model: one instance, the dynamic
  batcher taking up to ``--batch`` requests and waiting ``--queue-delay-us`` for them, the
  engine with the same settings. Its requests are ``kvrank serve``'s with a leading batch
  dimension of 1 and the user id as UINT8 bytes (see ``triton_engine``).

Over each protocol (``--protocols``: v2 HTTP with binary tensors, v2 gRPC with raw
contents), every user's entry is made first, so every measured answer is an L1 hit. Each
round, each server in turn (each first in turn) gets ``--callers`` closed-loop callers
(aiohttp or grpc.aio, bodies encoded beforehand) for ``--seconds``: answered hits per
second, client p50/p99, and requests per batch (``kvrank serve``'s scoring passes; the
batches Triton's batcher handed the model, whose requests the engine may pass together).
Then per server the idle hit (one caller, p50) and an open loop at 80 % of that server's
median capacity (client p99). Each user's scores must be the same
bits by every server and protocol (the same engine), and every answer an L1 hit with
status 200 (the run fails otherwise). Prints a table and writes JSON; ``make bench-triton``
runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import site
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np
import torch
from bench_batching import OPEN_LOAD, SIZES, load_arguments, passes, percentiles
from bench_wire import start
from rich.console import Console
from rich.table import Table
from triton_engine import OUTCOME, triton_inputs
from tritonclient.grpc import service_pb2 as pb

from kvrank.metrics import INFER_METHOD
from kvrank.model.artifact import load_ranker, save_model
from kvrank.model.ranker import RankerModel
from kvrank.server.oip import HEADER_LENGTH, USER_ID, input_metadata, tensors
from kvrank.tools.callers import MODEL_NAME, grpc_request, http_request
from kvrank.tools.overload import request_pool
from kvrank.tools.processes import free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
TRITON_MODEL = "kvrank"


@dataclass(frozen=True)
class Target:
    """One server by one protocol: where it answers (HTTP: the infer URL; gRPC:
    ``host:port``), and each user's request to it, encoded (the body and its headers)."""

    address: str
    protocol: str
    payloads: list[tuple[bytes, dict[str, str]]]
    batches: Callable[[], tuple[float, float]]
    """The server's count of model calls so far and the requests they took: ``kvrank
    serve``'s scoring passes, Triton's executions of the model (its batcher's batches)."""


@dataclass(frozen=True)
class Listening:
    """Where a Triton server answers: its HTTP URL and its gRPC ``host:port``."""

    http: str
    grpc: str


# ------------------------------------------------------------------------ Triton
def triton_dist() -> Path:
    """The unpacked ``nvidia-pytriton`` wheel (downloaded once)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "fetch-triton.sh"), sys.executable],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return Path(out.stdout.strip().splitlines()[-1])


def model_repository(work: Path, dist: Path, settings: dict[str, Any], args: Any) -> Path:
    """A repository with one model: the engine, its inputs those ``kvrank serve`` takes."""
    spec = load_ranker(Path(settings["model_dir"])).features
    repo = work / "triton-models"
    (repo / TRITON_MODEL / "1").mkdir(parents=True)
    (repo / TRITON_MODEL / "1" / "model.py").write_text(
        (Path(__file__).parent / "triton_model.py").read_text()
    )
    inputs = ",\n".join(
        f'  {{ name: "{name}" data_type: {kind} dims: {dims} }}'
        for name, kind, dims in triton_inputs(input_metadata(spec))
    )
    # this interpreter's packages (their .pth files read, as at its own start) and the
    # sources it imports kvrank and the engine from
    paths = {
        "site_dirs": site.getsitepackages(),
        "sys_path": [str(Path(__file__).parent), str(ROOT / "ranker")],
    }
    (repo / TRITON_MODEL / "1" / "paths.json").write_text(json.dumps(paths))
    params = {"settings": json.dumps(settings)}
    parameters = "\n".join(
        f"parameters {{ key: {json.dumps(k)} value: {{ string_value: {json.dumps(v)} }} }}"
        for k, v in params.items()
    )
    (repo / TRITON_MODEL / "config.pbtxt").write_text(
        f'backend: "python"\nmax_batch_size: {args.batch}\n'
        f"input [\n{inputs}\n]\n"
        "output [\n"
        '  { name: "scores" data_type: TYPE_FP32 dims: [ -1 ] },\n'
        f'  {{ name: "{OUTCOME}" data_type: TYPE_UINT8 dims: [ -1 ] }}\n]\n'
        f"dynamic_batching {{ max_queue_delay_microseconds: {args.queue_delay_us} }}\n"
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
        f"{parameters}\n"
    )
    return repo


def backends(work: Path, dist: Path) -> Path:
    """The Python backend as Triton looks for it: its library, utils and this Python's stub."""
    server = dist / "pytriton" / "tritonserver"
    out = work / "triton-backends" / "python"
    out.mkdir(parents=True)
    for f in (server / "backends" / "python").iterdir():
        if f.is_file():
            (out / f.name).symlink_to(f)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    (out / "triton_python_backend_stub").symlink_to(
        server / "python_backend_stubs" / version / "triton_python_backend_stub"
    )
    return out.parent


@contextlib.contextmanager
def triton(work: Path, settings: dict[str, Any], args: Any) -> Iterator[Listening]:
    """``tritonserver`` serving the engine; yields where it listens."""
    dist = triton_dist()
    port, grpc_port = free_port(), free_port()
    # the stub links the libpython this interpreter was built with (not the system's)
    libs = [str(dist / "nvidia_pytriton.libs"), str(sysconfig.get_config_var("LIBDIR"))]
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(libs)}
    log = (work / "triton.log").open("w")
    proc = subprocess.Popen(
        [
            str(dist / "pytriton" / "tritonserver" / "bin" / "tritonserver"),
            f"--model-repository={model_repository(work, dist, settings, args)}",
            f"--backend-directory={backends(work, dist)}",
            f"--http-port={port}",
            f"--grpc-port={grpc_port}",
            "--allow-metrics=false",
            "--log-verbose=0",
        ],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited:\n{(work / 'triton.log').read_text()}")
            return status(f"{url}/v2/models/{TRITON_MODEL}/ready") == 200

        wait_for(ready, "Triton to load the engine", 180)
        yield Listening(url, f"127.0.0.1:{grpc_port}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def triton_batches(url: str) -> Callable[[], tuple[float, float]]:
    """Triton's executions of the engine's model and the requests they took (its statistics
    extension)."""

    def read() -> tuple[float, float]:
        with urllib.request.urlopen(f"{url}/v2/models/{TRITON_MODEL}/stats", timeout=10) as r:
            (stats,) = json.load(r)["model_stats"]
        return float(stats["execution_count"]), float(stats["inference_count"])

    return read


def status(url: str) -> int | None:
    """The status of a GET (``None``: nothing answered)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def triton_arrays(spec: Any, body: dict[str, Any]) -> list[tuple[str, str, np.ndarray]]:
    """``body`` as the engine's Triton model takes it: the v2 tensors of ``kvrank serve``
    with a batch dimension of 1, the user id as UINT8 bytes."""
    out = []
    for name, kind, array in tensors(spec, body):
        if name == USER_ID:
            kind, array = "UINT8", np.frombuffer(array[0], dtype=np.uint8)
        out.append((name, kind, array[np.newaxis]))
    return out


# ---------------------------------------------------------------------- requests
def http_answer(body: bytes, header_length: str | None) -> tuple[str, np.ndarray]:
    """A binary v2 HTTP answer's cache outcome and scores."""
    size = int(header_length) if header_length else len(body)
    head, data = json.loads(body[:size]), memoryview(body)[size:]
    values: dict[str, bytes] = {}
    for out in head["outputs"]:
        n = out["parameters"]["binary_data_size"]
        values[out["name"]], data = bytes(data[:n]), data[n:]
    return outcome(head.get("parameters", {}).get("cache"), values)


def grpc_answer(raw_answer: bytes) -> tuple[str, np.ndarray]:
    """A ``ModelInferResponse``'s cache outcome and scores."""
    answer = pb.ModelInferResponse.FromString(raw_answer)
    values = {
        o.name: raw for o, raw in zip(answer.outputs, answer.raw_output_contents, strict=True)
    }
    cache = answer.parameters["cache"].string_param if "cache" in answer.parameters else None
    return outcome(cache, values)


def outcome(cache: object, values: dict[str, bytes]) -> tuple[str, np.ndarray]:
    if OUTCOME in values:  # Triton's: an output, as its Python backend sets no parameters
        cache = values[OUTCOME].decode()
    return str(cache), np.frombuffer(values["scores"], dtype="<f4")


class Client:
    """Sends encoded requests to targets by either protocol (an async context manager
    holding an HTTP session of at most ``connections`` and a gRPC channel per address)."""

    def __init__(self, connections: int) -> None:
        limit = aiohttp.TCPConnector(limit=connections)
        self.session = aiohttp.ClientSession(connector=limit)
        self.channels: dict[str, grpc.aio.Channel] = {}

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.session.close()
        for channel in self.channels.values():
            await channel.close()

    async def call(
        self, target: Target, payload: tuple[bytes, dict[str, str]], hit: bool
    ) -> tuple[float, np.ndarray]:
        """One request's latency (ms) and scores; it must be answered, and (``hit``) from
        L1."""
        t0 = time.perf_counter()
        if target.protocol == "grpc":
            if target.address not in self.channels:
                self.channels[target.address] = grpc.aio.insecure_channel(target.address)
            infer = self.channels[target.address].unary_unary(INFER_METHOD)
            cache, scores = grpc_answer(await infer(payload[0], timeout=30))
        else:
            headers = {"content-type": "application/octet-stream", **payload[1]}
            async with self.session.post(target.address, data=payload[0], headers=headers) as r:
                body = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{target.address}: {r.status} {body[:300]!r}")
                cache, scores = http_answer(body, r.headers.get(HEADER_LENGTH))
        if hit and cache != "l1":
            raise RuntimeError(f"{target.address}: a {cache} where an L1 hit was due")
        return (time.perf_counter() - t0) * 1e3, scores


async def closed_loop(target: Target, callers: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    async with Client(callers) as client:
        start_t = time.perf_counter()

        async def caller(k: int) -> None:
            i = k
            while time.perf_counter() - start_t < seconds:
                payload = target.payloads[i % len(target.payloads)]
                latencies.append((await client.call(target, payload, True))[0])
                i += callers

        await asyncio.gather(*[caller(k) for k in range(callers)])
        elapsed = time.perf_counter() - start_t
    return {"hits_per_s": len(latencies) / elapsed, **percentiles(latencies)}


async def open_loop(target: Target, rate: float, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    n = max(1, int(rate * seconds))
    async with Client(0) as client:
        start_t = time.perf_counter()

        async def one(i: int) -> None:
            await asyncio.sleep(max(0.0, start_t + i / rate - time.perf_counter()))
            payload = target.payloads[i % len(target.payloads)]
            latencies.append((await client.call(target, payload, True))[0])

        await asyncio.gather(*[one(i) for i in range(n)])
    return {"rate": rate, **percentiles(latencies)}


async def each(target: Target, hit: bool) -> tuple[list[float], list[np.ndarray]]:
    """Each user's request once, one at a time: latencies and scores."""
    async with Client(1) as client:
        done = [await client.call(target, p, hit) for p in target.payloads]
    return [ms for ms, _ in done], [scores for _, scores in done]


# ----------------------------------------------------------------------- the run
def size_run(size: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    save_model(RankerModel(SIZES[size], f"{size}-v1").eval(), work / "model")
    spec = load_ranker(work / "model").features
    pool = request_pool(work / "model", args.candidates)
    bodies = [{**pool[i % len(pool)], "user_id": f"user-{i}"} for i in range(args.users)]
    engine = {
        "model_dir": str(work / "model"),
        "l1_bytes": 2**30,
        "torch_threads": 1,
        "ttl": {"fixed_seconds": 3600},
    }
    with contextlib.ExitStack() as running:
        ours_grpc = free_port()
        ours = start(work, "kvrank", grpc_port=ours_grpc)
        running.callback(ours.stop)
        triton_at = running.enter_context(triton(work, engine, args))
        ours_arrays = [tensors(spec, b) for b in bodies]

        def ours_passes() -> tuple[float, float]:
            return passes(ours)

        triton_arrays_ = [triton_arrays(spec, b) for b in bodies]
        targets: dict[str, Target] = {}
        for protocol in args.protocols.split(","):
            if protocol == "http":
                targets["kvrank/http"] = Target(
                    f"{ours.url}/v2/models/{MODEL_NAME}/infer",
                    "http",
                    [http_request(a) for a in ours_arrays],
                    ours_passes,
                )
                targets["triton/http"] = Target(
                    f"{triton_at.http}/v2/models/{TRITON_MODEL}/infer",
                    "http",
                    [http_request(a, ("scores", OUTCOME)) for a in triton_arrays_],
                    triton_batches(triton_at.http),
                )
            elif protocol == "grpc":
                targets["kvrank/grpc"] = Target(
                    f"127.0.0.1:{ours_grpc}",
                    "grpc",
                    [(grpc_request(a), {}) for a in ours_arrays],
                    ours_passes,
                )
                targets["triton/grpc"] = Target(
                    triton_at.grpc,
                    "grpc",
                    [(grpc_request(a, TRITON_MODEL), {}) for a in triton_arrays_],
                    triton_batches(triton_at.http),
                )
            else:
                raise SystemExit(f"--protocols: http or grpc, not {protocol!r}")
        for target in targets.values():  # every user's entry made: what follows are hits
            asyncio.run(each(target, hit=False))
        return measure(targets, args)


def measure(targets: dict[str, Target], args: argparse.Namespace) -> dict[str, Any]:
    names = list(targets)
    rounds: list[dict[str, Any]] = []
    for k in range(args.rounds):
        order = names[k % len(names) :] + names[: k % len(names)]
        one: dict[str, Any] = {}
        for n in order:
            before = targets[n].batches()
            one[n] = asyncio.run(closed_loop(targets[n], args.callers, args.seconds))
            after = targets[n].batches()
            if after[0] > before[0]:
                one[n]["requests_per_batch"] = (after[1] - before[1]) / (after[0] - before[0])
        rounds.append(one)
    reference = asyncio.run(each(targets[names[0]], hit=True))[1]
    result: dict[str, Any] = {}
    for name in names:
        idle, scores = asyncio.run(each(targets[name], hit=True))
        unequal = sum(not np.array_equal(a, b) for a, b in zip(scores, reference, strict=True))
        if unequal:
            raise SystemExit(f"{name}: {unequal} users' scores differ from {names[0]}'s")
        capacity = statistics.median(r[name]["hits_per_s"] for r in rounds)
        result[name] = {
            "hits_per_s": capacity,
            "hits_per_s_rounds": [r[name]["hits_per_s"] for r in rounds],
            "p50_ms": statistics.median(r[name]["p50_ms"] for r in rounds),
            "p99_ms": statistics.median(r[name]["p99_ms"] for r in rounds),
            "requests_per_batch": statistics.median(
                r[name].get("requests_per_batch", 0.0) for r in rounds
            ),
            "idle_p50_ms": statistics.median(idle),
            "open_loop": asyncio.run(open_loop(targets[name], OPEN_LOAD * capacity, args.seconds)),
            "users_compared": len(scores),
            "users_with_other_scores": unequal,
        }
    return {"rounds": rounds, "servers": result}


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = {}
    for size in args.sizes.split(","):
        with tempfile.TemporaryDirectory(prefix=f"kvrank-front-{size}-") as work:
            sizes[size] = size_run(size, args, Path(work))
    return {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "sizes": sizes,
    }


def show(report: dict[str, Any]) -> None:
    table = Table(title="One pod's front, L1 hits over v2, closed loop (medians of rounds)")
    columns = ("size", "front", "hits/s", "vs kvrank", "p50 ms", "p99 ms", "req/batch")
    for col in (*columns, "idle p50", "p99 @80%"):
        table.add_column(col, justify="right")
    for size, run_ in report["sizes"].items():
        servers = run_["servers"]
        for name, s in servers.items():
            ours = servers["kvrank/" + name.split("/")[1]]
            table.add_row(
                size,
                name,
                f"{s['hits_per_s']:.0f}",
                f"{s['hits_per_s'] / ours['hits_per_s']:.2f}×",
                f"{s['p50_ms']:.1f}",
                f"{s['p99_ms']:.1f}",
                f"{s['requests_per_batch']:.1f}",
                f"{s['idle_p50_ms']:.1f}",
                f"{s['open_loop']['p99_ms']:.1f}",
            )
    Console(width=120).print(table)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    load_arguments(p)
    p.add_argument("--protocols", default="http,grpc", help="v2 over http, grpc or both")
    p.add_argument("--batch", type=int, default=32, help="Triton's max_batch_size")
    p.add_argument("--queue-delay-us", type=int, default=100, help="Triton's batcher's wait")
    p.add_argument("--json", type=Path, default=Path("reports/bench-triton-front.json"))
    args = p.parse_args()
    report = run(args)
    show(report)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
