"""What the wire costs a production-size L1 hit, side by side on one real ``kvrank serve``:
the whole history as JSON (``json``), the history by reference (``json-ref``: ``If-Match:
"<seq_hash>"``, candidates only), and the Open Inference Protocol's binary tensors as
``tritonclient`` builds them, whole (``v2-binary``) and by reference (``v2-binary-ref``: the
``seq_hash`` input), and the same tensors as a gRPC ``ModelInfer`` with raw contents, as
``tritonclient.grpc`` sends them (``v2-grpc``, ``v2-grpc-ref``).

The body is production size (``PRODUCTION``'s columns: 1,500 events, 100 candidates) and the
model is the same layout made light (one narrow layer), so the server's work around the
model shows: receiving, parsing and validating the body, building tensors, hashing the
history, admission, the cache lookup and the answer. Every user's entry is made first; then
blocks of L1 hits are sent one at a time (no queueing) by each protocol in turn, each
protocol first in turn from round to round: short blocks in many rounds (64 hits, 10 rounds
by default), so that every protocol meets the same drifts of a shared machine's speed. For
each block: bytes sent per request, client p50/p99, and the server's CPU per request outside
the model — its process CPU time (every thread, in nanoseconds: :func:`cpu_s`) less the
model's scoring time (``kvrank_stage_seconds{stage="score"}``; one torch thread, so that time
is its CPU time), both read around the block. Every protocol must return the
same scores to the last bit for every user (the run fails otherwise). With ``--baseline
REV``, a second ``kvrank serve`` runs that commit's ``ranker/`` tree on the same model and
its JSON path (``json@baseline``) takes its turn in every round: each protocol is also
reported against it. Prints a table and writes JSON; ``make bench-wire`` runs it
(``WIRE_BASELINE=REV`` passes the baseline).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import torch
import tritonclient.http as triton
from rich.console import Console
from rich.table import Table
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from kvrank.model.artifact import save_model
from kvrank.model.config import PRODUCTION
from kvrank.model.features import example_candidates, example_user
from kvrank.model.onetrans import feature_spec
from kvrank.model.ranker import RankerModel
from kvrank.server.oip import HEADER_LENGTH
from kvrank.server.oip import tensors as oip_tensors
from kvrank.server.schemas import body_for
from kvrank.tools.callers import grpc_request
from kvrank.tools.processes import RankerProcess, free_port

LIGHT = PRODUCTION.model_copy(
    update={"d_model": 32, "n_layers": 1, "ffn_mult": 1, "ns_tokens": 1, "cand_tokens": 1}
)
"""Production's columns and window, one narrow layer and one token per candidate: a model
whose work is small (~1.5 ms a hit here) and is subtracted anyway; the smaller it is, the
less the figures outside it carry the noise of measuring it."""
PROTOCOLS = ("json", "json-ref", "v2-binary", "v2-binary-ref", "v2-grpc", "v2-grpc-ref")
INFER = "/v2/models/ranker/infer"
GRPC = "grpc"
"""A :class:`Send`'s path when it goes as a gRPC ``ModelInfer``."""
BASELINE = "json@baseline"
"""The JSON path of ``--baseline``'s tree, served beside this one's."""


@dataclass(frozen=True)
class Send:
    """One request as it goes on the wire, and how its answer reads."""

    path: str
    raw: bytes
    headers: dict[str, str]

    def send(self, client: httpx.Client, stub: Any) -> tuple[str, list[float]]:
        """Send it; the answer's cache outcome and scores."""
        if self.path == GRPC:
            answer = stub.ModelInfer(pb.ModelInferRequest.FromString(self.raw), timeout=60)
            scores = np.frombuffer(answer.raw_output_contents[0], "<f4").astype(float).tolist()
            return answer.parameters["cache"].string_param, scores
        resp = client.post(self.path, content=self.raw, headers=self.headers)
        resp.raise_for_status()
        return self.scores(resp)

    def scores(self, resp: httpx.Response) -> tuple[str, list[float]]:
        """An HTTP answer's cache outcome and scores."""
        if self.path != INFER:
            doc = resp.json()
            return doc["cache"], doc["scores"]
        size = int(resp.headers[HEADER_LENGTH])
        head = json.loads(resp.content[:size])
        scores = np.frombuffer(resp.content[size:], "<f4").astype(float).tolist()
        return head["parameters"]["cache"], scores


def v2_binary(body: dict[str, Any], seq_hash: str | None = None) -> Send:
    """What ``tritonclient`` sends for ``body``: binary tensors, scores asked as binary."""
    arrays = oip_tensors(feature_spec(LIGHT), body, seq_hash)
    inputs = []
    for name, kind, array in arrays:
        tensor = triton.InferInput(name, list(array.shape), kind)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    outputs = [triton.InferRequestedOutput("scores")]
    raw, json_size = triton.InferenceServerClient.generate_request_body(inputs, outputs)
    headers = {"content-type": "application/octet-stream"}
    if json_size is not None:
        headers[HEADER_LENGTH] = str(json_size)
    return Send(INFER, raw, headers)


def v2_grpc(body: dict[str, Any], seq_hash: str | None = None) -> Send:
    """What ``tritonclient.grpc`` sends for ``body``: a ``ModelInferRequest`` with raw
    contents (its bytes are what goes on the wire, less HTTP/2's framing)."""
    return Send(GRPC, grpc_request(oip_tensors(feature_spec(LIGHT), body, seq_hash)), {})


SCORE_SUM = "kvrank_stage_seconds_sum"


def cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` so far (every thread), read from its CPU-time clock
    (Linux's ``clock_getcpuclockid``: the nanoseconds the scheduler counted, where
    ``/proc/<pid>/stat`` counts 10 ms ticks — a tenth of a 16-request block of hits)."""
    return time.clock_gettime(((~pid) << 3) | _CPUCLOCK_SCHED)


_CPUCLOCK_SCHED = 2
"""The kernel's process CPU clock id of a pid: ``(~pid << 3) | 2`` (what glibc's
``clock_getcpuclockid`` returns; Python offers it for its own threads only)."""


def scored_s(client: httpx.Client) -> float:
    """The model's scoring time so far, from the server's own histogram."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(SCORE_SUM) and 'stage="score"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def bodies(users: int, events: int, candidates: int, seed: int) -> list[dict[str, Any]]:
    spec = feature_spec(LIGHT)
    gen = torch.Generator().manual_seed(seed)
    return [
        body_for(
            spec,
            f"user{u}",
            example_user(spec, events, gen),
            example_candidates(spec, candidates, gen),
        )
        for u in range(users)
    ]


def block(client: httpx.Client, stub: Any, pid: int, sends: list[Send]) -> dict[str, Any]:
    """Send every request once, one at a time; what the block cost on each side."""
    score0 = scored_s(client)
    cpu0 = cpu_s(pid)
    latencies, answers = [], []
    for send in sends:
        started = time.perf_counter()
        answer = send.send(client, stub)
        latencies.append((time.perf_counter() - started) * 1e3)
        answers.append(answer)
    cpu1 = cpu_s(pid)
    score1 = scored_s(client)
    n = len(sends)
    q = statistics.quantiles(latencies, n=100)
    return {
        "requests": n,
        "bytes_per_request": sum(len(s.raw) for s in sends) / n,
        "server_cpu_ms": (cpu1 - cpu0) * 1e3 / n,
        "model_score_ms": (score1 - score0) * 1e3 / n,
        "outside_model_cpu_ms": ((cpu1 - cpu0) - (score1 - score0)) * 1e3 / n,
        "client_p50_ms": q[49],
        "client_p99_ms": q[98],
        "caches": sorted({cache for cache, _ in answers}),
        "scores": [scores for _, scores in answers],
    }


JSON_HEADER = {"content-type": "application/json"}


def start(
    work: Path,
    name: str,
    source: Path | None = None,
    grpc_port: int | None = None,
    settings: dict[str, str] | None = None,
) -> RankerProcess:
    """A ``kvrank serve`` of the benchmark's model (``source``: that tree's ``kvrank``;
    ``grpc_port``: with the v2 gRPC service there; ``settings``: more ``KVRANK_*``)."""
    # entries kept an hour: a slow round must not find its users expired (a 412)
    env = {"KVRANK_TTL_FIXED_SECONDS": "3600", **(settings or {})}
    if source is not None:
        env["PYTHONPATH"] = str(source / "ranker")
    # one torch thread: the model's CPU time is then its wall time, which the score stage
    # measures (a second thread's spinning would count as work outside the model)
    flags: tuple[str, ...] = ("--l1-bytes", str(2**30), "--torch-threads", "1")
    if grpc_port is not None:
        flags += ("--grpc-port", str(grpc_port))
    (work / name).mkdir()
    return RankerProcess.start(work / "model", work / name, *flags, env=env)


def baseline_tree(rev: str, work: Path) -> Path:
    """The ``ranker/`` tree of commit ``rev`` of this repository, unpacked under ``work``."""
    tree = work / "baseline"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "archive", rev, "ranker"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def warm(client: httpx.Client, users: list[dict[str, Any]]) -> list[httpx.Response]:
    """Every user's entry made (its first answer each)."""
    answers = []
    for body in users:
        first = client.post("/v1/score", content=json.dumps(body).encode(), headers=JSON_HEADER)
        first.raise_for_status()
        answers.append(first)
    return answers


def sends_for(users: list[dict[str, Any]], first: list[httpx.Response]) -> dict[str, list[Send]]:
    """Each user's L1 hit by each protocol."""
    sends: dict[str, list[Send]] = {p: [] for p in PROTOCOLS}
    for body, answer in zip(users, first, strict=True):
        ref = {"user_id": body["user_id"], "candidates": body["candidates"]}
        tag = {**JSON_HEADER, "If-Match": answer.headers["etag"]}
        sends["json"].append(Send("/v1/score", json.dumps(body).encode(), JSON_HEADER))
        sends["json-ref"].append(Send("/v1/score", json.dumps(ref).encode(), tag))
        sends["v2-binary"].append(v2_binary(body))
        sends["v2-binary-ref"].append(v2_binary(body, answer.json()["seq_hash"]))
        sends["v2-grpc"].append(v2_grpc(body))
        sends["v2-grpc-ref"].append(v2_grpc(body, answer.json()["seq_hash"]))
    return sends


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="kvrank-wire-"))
    torch.manual_seed(0)
    save_model(RankerModel(LIGHT, "v1").eval(), work / "model")
    users = bodies(args.users, args.events, args.candidates, args.seed)
    grpc_port = free_port()
    with contextlib.ExitStack() as running:  # whatever fails, every server is stopped
        rankers = {"json": start(work, "ranker", grpc_port=grpc_port)}
        running.callback(rankers["json"].stop)
        if args.baseline:
            tree = baseline_tree(args.baseline, work)
            rankers[BASELINE] = start(work, "baseline-ranker", tree)
            running.callback(rankers[BASELINE].stop)
        clients = {
            k: running.enter_context(httpx.Client(base_url=r.url, timeout=60))
            for k, r in rankers.items()
        }
        channel = running.enter_context(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        sends = sends_for(users, warm(clients["json"], users))
        targets = {p: (clients["json"], rankers["json"], sends[p]) for p in PROTOCOLS}
        if args.baseline:  # today's JSON path beside the one this tree serves
            warm(clients[BASELINE], users)
            targets[BASELINE] = (clients[BASELINE], rankers[BASELINE], sends["json"])
        names = list(targets)
        rounds: list[dict[str, Any]] = []
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]  # each first in turn
            rounds.append(
                {
                    p: block(
                        targets[p][0], stub, targets[p][1].proc.pid, targets[p][2] * args.repeat
                    )
                    for p in order
                }
            )
    return summarize(args, rounds, names)


def summarize(
    args: argparse.Namespace, rounds: list[dict[str, Any]], names: list[str]
) -> dict[str, Any]:
    equal = all(r[p]["scores"] == r["json"]["scores"] for r in rounds for p in names)
    keys = ("bytes_per_request", "server_cpu_ms", "model_score_ms", "outside_model_cpu_ms",
            "client_p50_ms", "client_p99_ms")  # fmt: skip
    per = {p: {k: statistics.median(r[p][k] for r in rounds) for k in keys} for p in names}
    for p in names:
        per[p]["caches"] = sorted({c for r in rounds for c in r[p]["caches"]})
    ratios = ("bytes_per_request", "outside_model_cpu_ms", "client_p50_ms")
    against = [(p, "json") for p in PROTOCOLS[1:]]
    if BASELINE in per:  # every protocol against the JSON path of the baseline's tree
        against = [(p, BASELINE) for p in PROTOCOLS] + against
    return {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "workload": {
            "users": args.users,
            "events": args.events,
            "candidates": args.candidates,
            "requests_per_block": args.users * args.repeat,
            "rounds": args.rounds,
            "baseline": args.baseline,
        },
        "protocols": per,
        "ratios": {
            f"{p}_vs_{base}": {k: per[p][k] / per[base][k] for k in ratios} for p, base in against
        },
        # the same ratios round by round (each round's blocks ran back to back): the median
        # and range, steadier than a ratio of medians when the machine's pace drifts
        "round_ratios": {
            f"{p}_vs_{base}": _spread([r[p][k] / r[base][k] for r in rounds])
            for p, base in against
            for k in ("outside_model_cpu_ms",)
        },
        "equal_scores": equal,
        "rounds": [
            {p: {k: v for k, v in r[p].items() if k != "scores"} for p in names} for r in rounds
        ],
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def show(report: dict[str, Any]) -> None:
    table = Table(title="one production-size L1 hit: medians over rounds")
    for col in ("protocol", "bytes", "server CPU ms", "model ms", "outside model ms",
                "p50 ms", "p99 ms"):  # fmt: skip
        table.add_column(col)
    for p, m in report["protocols"].items():
        table.add_row(
            p,
            f"{m['bytes_per_request']:,.0f}",
            f"{m['server_cpu_ms']:.2f}",
            f"{m['model_score_ms']:.2f}",
            f"{m['outside_model_cpu_ms']:.2f}",
            f"{m['client_p50_ms']:.2f}",
            f"{m['client_p99_ms']:.2f}",
        )
    console = Console(width=160)
    console.print(table)
    for name, ratios in report["ratios"].items():
        console.print(name, {k: round(v, 3) for k, v in ratios.items()})
    for name, spread in report["round_ratios"].items():
        console.print(
            f"{name}, CPU outside the model, per round:",
            {k: round(v, 3) for k, v in spread.items()},
        )
    console.print(f"equal scores (fp32, bitwise): {report['equal_scores']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--events", type=int, default=1500)
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=4, help="each user's hits per block")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--baseline",
        default=None,
        help="a commit of this repository whose JSON path to serve beside (e.g. HEAD~3)",
    )
    args = parser.parse_args()
    report = run(args)
    show(report)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    if not report["equal_scores"]:
        raise SystemExit("the protocols returned different scores")


if __name__ == "__main__":
    main()
