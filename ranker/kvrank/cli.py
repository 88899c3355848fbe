"""The ``kvrank`` command line: train, bench, demo, and (as they land) serve/loadtest/cache.

A thin shell: it parses options, reads nothing at import time, and hands off to the
library (``kvrank.train``, ``kvrank.bench``). Heavy imports (torch) happen inside the
commands so that ``kvrank --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, cast

import typer

if TYPE_CHECKING:
    from kvrank.model.config import ComputeDType
    from kvrank.server.config import ServerConfig

PLUGIN_HELP = (
    "module:builder that builds the artifact's model, from a module importable here (the"
    " working directory included) instead of an installed package (env KVRANK_PLUGIN)."
)
app = typer.Typer(
    help="kvrank: ranking with a cached user-side K/V (data-plane tools).",
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        from kvrank import __version__

        typer.echo(f"kvrank {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """kvrank: ranking with a cached user-side K/V (data-plane tools)."""


cache_app = typer.Typer(help="Cache administration (purge a namespace, invalidate a user).")
app.add_typer(cache_app, name="cache")

PROFILES = ("quick", "production")
TRAIN_PROFILES = ("quick", "production", "production-compact")


@app.command()
def train(
    out: Annotated[Path, typer.Option(help="Artifact directory to write.")] = Path(
        "artifacts/quick"
    ),
    profile: Annotated[
        str,
        typer.Option(
            help="Model size: quick, production, or production-compact (pyramid + 2 layers).",
        ),
    ] = "quick",
    steps: Annotated[int, typer.Option(min=1, help="Optimizer steps.")] = 300,
    version: Annotated[str, typer.Option(help="Model version string.")] = "v1",
    seed: Annotated[int, typer.Option(help="Synthetic-world seed.")] = 0,
    batch_users: Annotated[int, typer.Option(min=1, help="Users per optimizer step.")] = 32,
    time_budget: Annotated[
        float, typer.Option(min=1, help="Stop after this many seconds with what was learnt.")
    ] = 110.0,
    data: Annotated[
        str,
        typer.Option(
            help="synthetic (planted structure, seconds), or movielens-100k (GroupLens' real"
            " ratings, fetched once into the cache: evaluation, baselines, cache shortcuts).",
        ),
    ] = "synthetic",
    eval_requests: Annotated[
        int | None,
        typer.Option(min=1, help="movielens-100k: evaluate on this many requests (all: ~10k)."),
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="movielens-100k: write the report here.")
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(help="movielens-100k: draw hit ratio vs TTL on the real timeline here."),
    ] = None,
) -> None:
    """Train the ranker, report held-out quality (and what the cache shortcuts cost), write an
    artifact."""
    if data == "movielens-100k":
        from kvrank.tools.movielens import RealDataRun, run_movielens

        run = RealDataRun(out, steps, seed, batch_users, time_budget_s=time_budget,
                          eval_requests=eval_requests, json_out=json_out, plot=plot)  # fmt: skip
        run_movielens(run)
        return
    if data != "synthetic":
        raise typer.BadParameter("synthetic or movielens-100k", param_hint="--data")
    from kvrank.tools.jobs import train_and_save

    if profile not in TRAIN_PROFILES:
        raise typer.BadParameter(f"profile must be one of {TRAIN_PROFILES}", param_hint="--profile")
    train_and_save(out, profile, steps, version, seed, batch_users, time_budget)


ServedOption = Annotated[
    str | None,
    typer.Option(
        "--protocol",
        help="Comma-separated, json first (json, json-ref, v2-http, v2-grpc): then serve the"
        " profile's model (or --model) with kvrank serve on --device and time each user's L1"
        " hit by each protocol, one request at a time (a 'served' section).",
    ),
]


def _protocols(given: str | None) -> tuple[str, ...]:
    """``--protocol`` as a tuple, checked before any work (empty: no served step)."""
    from kvrank.tools.served import check_protocols

    if not given:
        return ()
    protocols = tuple(given.split(","))
    try:
        check_protocols(protocols)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--protocol") from None
    return protocols


@app.command()
def bench(
    profile: Annotated[
        str, typer.Option(help="quick (seconds) or production (L=6, d=256, 1,500-event histories).")
    ] = "quick",
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    compute_dtype: Annotated[
        str,
        typer.Option(
            help="fp32, or bf16 / fp16 (what a GPU serves in): the profile's models in that"
            " dtype (the quick one trained in fp32, then cast)."
        ),
    ] = "fp32",
    candidates: Annotated[
        str | None, typer.Option(help="Comma-separated candidate counts, e.g. 50,100,200.")
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a latency-vs-C PNG here.")] = None,
    model: Annotated[
        Path | None, typer.Option(help="Trained artifact for the INT8 AUC check.")
    ] = None,
    l2: Annotated[
        bool, typer.Option(help="Also time L2 round trips on a private redis-server.")
    ] = True,
    compact_model: Annotated[
        Path | None,
        typer.Option(
            help="Trained artifact of the profile's compact config (pyramid +"
            " candidate_layers): scores approximate increments against full encodes."
        ),
    ] = None,
    protocol: ServedOption = None,
) -> None:
    """Measure no-cache (batched, serial) / miss / hit / int8 / incremental scoring side by
    side; with --protocol, the same model served, its L1 hit by each protocol."""
    import shutil
    import tempfile

    from kvrank.bench.runner import run_bench
    from kvrank.tools.processes import ProcessStack

    counts = [int(c) for c in candidates.split(",")] if candidates else None
    protocols = _protocols(protocol)
    if profile not in PROFILES:
        raise typer.BadParameter(f"profile must be one of {PROFILES}", param_hint="--profile")
    if compute_dtype not in ("fp32", "bf16", "fp16"):
        raise typer.BadParameter("fp32, bf16 or fp16", param_hint="--compute-dtype")
    if compute_dtype != "fp32" and model is not None:
        raise typer.BadParameter(
            "a --model artifact computes in the dtype it was saved with",
            param_hint="--compute-dtype",
        )
    with ProcessStack(Path(tempfile.mkdtemp(prefix="kvrank-bench-"))) as stack:
        url = stack.start_redis() if l2 and shutil.which("redis-server") else None
        dtype = cast("ComputeDType", compute_dtype)
        run_bench(profile, device, counts, json_out, plot, model, url, compact_model, dtype)
    if protocols:
        from kvrank.tools.served import bench_served

        bench_served(profile, dtype, device, protocols, model, max(counts or [100]), json_out)


@app.command()
def demo(
    model: Annotated[
        Path, typer.Option(help="Artifact to use; trained here first if missing.")
    ] = Path("artifacts/quick"),
    report: Annotated[Path, typer.Option(help="Report folder.")] = Path("reports/demo"),
) -> None:
    """Train or load the small model, serve it with and without the cache, replay traffic."""
    from kvrank.tools.jobs import run_demo

    run_demo(model, report)


@app.command()
def serve(
    model: Annotated[Path | None, typer.Option(help="Model artifact directory.")] = None,
    redis: Annotated[str | None, typer.Option(help="L2 Redis URL (omit: L1 only).")] = None,
    redis_cluster: Annotated[bool, typer.Option(help="The URL is a Redis Cluster.")] = False,
    namespace: Annotated[str | None, typer.Option(help="Cache namespace.")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address.")] = None,
    port: Annotated[int | None, typer.Option(help="Port.")] = None,
    grpc_port: Annotated[
        int | None, typer.Option(help="The v2 gRPC service's port (omit: no gRPC).")
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="JSON/YAML config file (watched for TTL changes).")
    ] = None,
    l1_bytes: Annotated[int | None, typer.Option(help="L1 byte budget.")] = None,
    device: Annotated[
        str | None, typer.Option(help="auto (default: CUDA when there is a GPU), cpu or cuda.")
    ] = None,
    torch_threads: Annotated[
        int | None, typer.Option(help="torch intra-op threads (0: one per core).")
    ] = None,
    no_cache: Annotated[
        bool,
        typer.Option(help="Serve without K/V cache (the C full sequences batched; the baseline)."),
    ] = False,
    plugin: Annotated[str | None, typer.Option(help=PLUGIN_HELP)] = None,
    fronts: Annotated[
        int | None,
        typer.Option(
            help="N: an engine process owns the model and the cache, N front processes parse"
            " requests (0: one process does all)."
        ),
    ] = None,
) -> None:
    """Run the scoring server (FastAPI, two-level cache). Options override KVRANK_* env."""
    from kvrank.server.process import serve as serve_app

    overrides: dict[str, object] = {
        "model_dir": str(model) if model else None,
        "namespace": namespace,
        "host": host,
        "port": port,
        "grpc_port": grpc_port,
        "config_file": str(config) if config else None,
        "l1_bytes": l1_bytes,
        "device": device,
        "torch_threads": torch_threads,
        "cache_mode": "full" if no_cache else None,
        "plugin": plugin,
        "fronts": fronts,
    }
    if redis:
        overrides["redis"] = {"url": redis, "cluster": redis_cluster}
    serve_app(_servable_config(overrides))


def _servable_config(overrides: dict[str, object]) -> ServerConfig:
    """The config, once it parses, names a device this machine has and a model artifact
    that exists (a URL is downloaded now): each refusal exits 2 saying why, before the port
    opens (told to use a GPU it does not have, a pod never falls back to the CPU silently)."""
    from pydantic import ValidationError

    from kvrank.errors import ArtifactError, DeviceError
    from kvrank.model.artifact import resolve_artifact
    from kvrank.model.device import resolve_device
    from kvrank.server.config import load_config

    try:
        cfg = load_config(overrides)
    except (ValidationError, ValueError, OSError) as exc:
        _refuse(f"invalid configuration: {exc}", exc)
    try:
        resolve_device(cfg.device)
        local = resolve_artifact(cfg.model_dir, Path(cfg.model_cache_dir), cfg.model_sha256)
    except (DeviceError, ArtifactError) as exc:
        _refuse(str(exc), exc)
    if not (local / "config.json").is_file():
        _refuse(
            f"no model artifact at {cfg.model_dir} (config.json missing);"
            " train one with `kvrank train --out DIR`"
        )
    return cfg


def _refuse(why: str, cause: BaseException | None = None) -> NoReturn:
    typer.secho(f"kvrank serve: {why}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2) from cause


@app.command("example-request")
def example_request(
    directory: Annotated[Path, typer.Argument(help="Model artifact directory.")],
    user: Annotated[str, typer.Option(help="The request's user_id.")] = "user-1",
    events: Annotated[int, typer.Option(min=1, max=10_000, help="Events in its history.")] = 20,
    candidates: Annotated[int, typer.Option(min=1, max=10_000, help="Candidates.")] = 50,
    seed: Annotated[int, typer.Option(help="Seed of the random ids and values.")] = 0,
    protocol: Annotated[
        str,
        typer.Option(
            help="json: a /v1/score body; v2 (or v2-http): a /v2/models/{name}/infer body;"
            " v2-grpc: a ModelInferRequest as protobuf JSON (grpcurl -d, json_format.Parse)."
        ),
    ] = "json",
    seq_hash: Annotated[
        str | None,
        typer.Option(help="The history by reference: an answer's seq_hash (candidates only)."),
    ] = None,
) -> None:
    """Print a valid /v1/score body for this model: its own fields, ids inside its
    vocabularies, random values (the same for a seed). E.g. `kvrank example-request
    artifacts/quick > request.json`; without candidates it is a /v1/prefetch body. With
    --protocol v2, the same request as Open Inference Protocol JSON tensors; with v2-grpc, as
    the gRPC ModelInferRequest (typed contents) in protobuf's JSON form."""
    import json

    import torch

    from kvrank.errors import ArtifactError
    from kvrank.model.artifact import load_ranker
    from kvrank.model.features import example_candidates, example_user
    from kvrank.server.schemas import body_for

    try:
        spec = load_ranker(directory).features
    except ArtifactError as exc:
        typer.secho(f"kvrank example-request: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from exc
    g = torch.Generator().manual_seed(seed)
    user_input = example_user(spec, events, g)
    body = body_for(spec, user, user_input, example_candidates(spec, candidates, g))
    # dense values to 4 decimals: a body a person can read and edit
    short = json.loads(json.dumps(body), parse_float=lambda text: round(float(text), 4))
    if protocol in ("v2", "v2-http", "v2-grpc"):
        from google.protobuf.json_format import MessageToJson  # type: ignore[import-untyped]

        from kvrank.server.oip import json_request
        from kvrank.server.oip_grpc import request_message

        request = json_request(spec, short, seq_hash)
        if protocol == "v2-grpc":
            typer.echo(MessageToJson(request_message(request), indent=None))
        else:
            typer.echo(json.dumps(request))
    elif protocol == "json":
        by_ref = {"user_id": user, "candidates": short["candidates"], "seq_hash": seq_hash}
        typer.echo(json.dumps(short if seq_hash is None else by_ref))
    else:
        raise typer.BadParameter("json, v2, v2-http or v2-grpc", param_hint="--protocol")


@app.command("model-digest")
def model_digest(
    directory: Annotated[Path, typer.Argument(help="Model artifact directory.")],
) -> None:
    """Print the artifact's SHA-256 — config.json and model.safetensors, as
    `sha256sum config.json model.safetensors | sha256sum` prints it — for model_sha256
    (RankerDeployment: model.sha256, canary.sha256)."""
    from kvrank.model.artifact import artifact_sha256

    try:
        typer.echo(artifact_sha256(directory))
    except OSError as exc:
        typer.secho(f"kvrank model-digest: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from exc


@app.command("check-model")
def check_model(
    directory: Annotated[Path, typer.Argument(help="Model artifact directory.")],
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "cpu",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the report here.")] = None,
    plugin: Annotated[str | None, typer.Option(help=PLUGIN_HELP, envvar="KVRANK_PLUGIN")] = None,
) -> None:
    """Check that a model is safe to serve from a K/V cache (the checks a pod runs at load):
    cached == no-cache scores, candidates independent, deterministic state, byte round trip,
    every K/V dtype, score_many, exact extension. Exits 1 naming each failed check."""
    import json

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from kvrank.errors import ArtifactError, DeviceError
    from kvrank.model.artifact import load_ranker
    from kvrank.model.checks import CheckPlan
    from kvrank.model.checks import check_model as run_checks
    from kvrank.model.device import resolve_device
    from kvrank.model.golden import load_golden
    from kvrank.model.registry import use_plugin

    try:
        use_plugin(plugin)
        model = load_ranker(directory, resolve_device(device))
        golden = load_golden(directory, model.features)
    except (ArtifactError, DeviceError) as exc:
        typer.secho(f"kvrank check-model: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from exc
    report = run_checks(model, CheckPlan(golden=golden))
    table = Table(title=f"{directory} — {type(model).__name__} {model.version}")
    for column in ("check", "result", "detail", "s"):
        table.add_column(column)
    for r in report.results:
        verdict = "[green]ok[/]" if r.passed else "[red]FAILED[/]"
        table.add_row(escape(r.name), verdict, escape(r.detail), f"{r.seconds:.2f}")
    Console().print(table)
    if json_out is not None:
        doc = {
            "model_version": model.version,
            "passed": report.passed,
            "checks": [vars(r) for r in report.results],
        }
        json_out.write_text(json.dumps(doc, indent=2) + "\n")
    if not report.passed:
        failed = ", ".join(r.name for r in report.failed)
        typer.secho(f"kvrank check-model: failed: {failed}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=1)


DeadlineOption = Annotated[
    int, typer.Option(min=1, max=60_000, help="overload: each caller's deadline.")
]
SilentOption = Annotated[
    bool,
    typer.Option(
        help="overload: callers give up at --deadline-ms without sending it (the server"
        " goes by its default deadline and what it learns from callers that leave)."
    ),
]
ScenarioOption = Annotated[
    str,
    typer.Option(
        help="replay: the workload, cache vs no cache; overload: a spike of --factor ×"
        " one ranker's miss capacity, with and without admission control."
    ),
]
ProtocolOption = Annotated[
    str,
    typer.Option(
        help="replay: json sends every history whole to /v1/score; json-ref sends an unchanged"
        " one by reference (If-Match with the user's last ETag; whole again after a 412);"
        " v2-http: Open Inference Protocol infer with binary tensors; v2-grpc: its ModelInfer"
        " on the rankers' gRPC ports."
    ),
]


@app.command()
def loadtest(
    profile: Annotated[
        str, typer.Option(help="smoke (seconds), quick (~1.5 min), full.")
    ] = "quick",
    model: Annotated[Path | None, typer.Option(help="Artifact (default: seed-fixed).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    users: Annotated[int | None, typer.Option(min=1, help="Distinct users.")] = None,
    zipf: Annotated[
        float | None, typer.Option(min=0.0, help="Zipf exponent of user popularity.")
    ] = None,
    arrival: Annotated[
        str | None, typer.Option(help="poisson, or bursty (heavy-tailed Pareto gaps).")
    ] = None,
    rate: Annotated[float | None, typer.Option(min=0.01, help="Mean requests/s.")] = None,
    candidates: Annotated[int | None, typer.Option(min=1, help="Candidates per request.")] = None,
    new_events_prob: Annotated[
        float | None,
        typer.Option(min=0.0, max=1.0, help="Chance a returning user brings new events."),
    ] = None,
    history_fill: Annotated[
        float | None,
        typer.Option(
            min=0.01, max=1.0, help="Share of the event window a new user's history fills."
        ),
    ] = None,
    pods: Annotated[int, typer.Option(min=1, help="Cache-enabled rankers sharing Redis.")] = 2,
    workload: Annotated[
        str,
        typer.Option(
            help="replay: synthetic users, or movielens-100k (every real rating a request at"
            " its timestamp, the clock compressed to --rate; serve a model trained with"
            " kvrank train --data movielens-100k)."
        ),
    ] = "synthetic",
    scenario: ScenarioOption = "replay",
    factor: Annotated[float, typer.Option(min=1.0, help="overload: × capacity.")] = 4.0,
    duration: Annotated[float, typer.Option(min=1.0, help="overload: seconds of spike.")] = 15.0,
    deadline_ms: DeadlineOption = 1_000,
    silent_callers: SilentOption = False,
    protocol: ProtocolOption = "json",
    fronts: Annotated[
        int, typer.Option(min=0, max=64, help="overload: rankers with N front processes.")
    ] = 0,
) -> None:
    """A workload against cache-enabled and cache-disabled servers side by side (the profile
    sets it, each option replaces a knob), or a spike with and without admission control."""
    if scenario == "overload":
        from kvrank.tools.jobs import run_overload_test

        spike = (factor, duration, deadline_ms, candidates or 100, not silent_callers, fronts)
        run_overload_test(model, json_out, *spike)
        return
    if scenario != "replay":
        raise typer.BadParameter("replay or overload", param_hint="--scenario")
    knobs = {"users": users, "zipf_s": zipf, "arrival": arrival, "rate_qps": rate,
             "candidates": candidates, "new_events_prob": new_events_prob,
             "history_fill": history_fill, "protocol": protocol}  # fmt: skip
    _replay(profile, model, json_out, knobs, pods, workload)


def _replay(
    profile: str,
    model: Path | None,
    json_out: Path | None,
    knobs: dict[str, Any],
    pods: int,
    workload: str,
) -> None:
    """``loadtest --scenario replay``: the options checked, then the side-by-side run."""
    from kvrank.errors import WorkloadError
    from kvrank.tools.callers import PROTOCOLS
    from kvrank.tools.jobs import run_loadtest
    from kvrank.tools.loadtest import SOURCES

    if profile not in ("smoke", "quick", "full"):
        raise typer.BadParameter("profile must be smoke, quick or full", param_hint="--profile")
    if knobs["arrival"] not in (None, "poisson", "bursty"):
        raise typer.BadParameter("poisson or bursty", param_hint="--arrival")
    if workload not in SOURCES:
        raise typer.BadParameter(" or ".join(SOURCES), param_hint="--workload")
    protocol = knobs.pop("protocol")
    if protocol not in PROTOCOLS:
        raise typer.BadParameter(" or ".join(PROTOCOLS), param_hint="--protocol")
    try:
        run_loadtest(profile, model, json_out, knobs, pods, workload, protocol)
    except WorkloadError as err:
        raise typer.BadParameter(str(err), param_hint="--model") from err


@app.command()
def shadowtest(
    profile: Annotated[str, typer.Option(help="smoke (seconds), quick, full.")] = "quick",
    sample: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of requests mirrored.")
    ] = 0.2,
    model: Annotated[Path | None, typer.Option(help="Artifact (default: seed-fixed).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
) -> None:
    """What shadow scoring costs the stable pod: p50/p99 with shadowing, without (twice: the
    noise floor) and with the canary down, side by side in one run."""
    from kvrank.tools.jobs import run_shadowtest

    if profile not in ("smoke", "quick", "full"):
        raise typer.BadParameter("profile must be smoke, quick or full", param_hint="--profile")
    run_shadowtest(profile, sample, model, json_out)


@cache_app.command("purge")
def cache_purge(
    namespace: Annotated[str, typer.Option(help="Namespace to remove.")],
    redis: Annotated[str, typer.Option(help="Redis URL.", envvar="KVRANK_REDIS_URL")],
    cluster: Annotated[bool, typer.Option(help="The URL is a Redis Cluster.")] = False,
    max_keys_per_s: Annotated[float, typer.Option(help="Rate limit.")] = 50_000,
    tls_ca_file: Annotated[
        str | None,
        typer.Option(help="rediss://: trust only this CA.", envvar="KVRANK_REDIS_TLS_CA_FILE"),
    ] = None,
    tls_check_hostname: Annotated[
        bool, typer.Option(help="rediss://: the certificate must name the host (off: chain only).")
    ] = True,
) -> None:
    """Remove every key of one cache namespace (SCAN + UNLINK on every master)."""
    import asyncio
    import os

    from kvrank.cache import RedisSettings, purge_namespace

    settings = RedisSettings(
        redis,
        cluster=cluster,
        password=os.environ.get("KVRANK_REDIS_PASSWORD"),
        tls_ca_file=tls_ca_file,
        tls_check_hostname=tls_check_hostname,
    )
    removed = asyncio.run(purge_namespace(settings, namespace, max_keys_per_s=max_keys_per_s))
    typer.echo(f"purged namespace {namespace!r}: {removed} keys removed")


@cache_app.command("acl-rules")
def cache_acl_rules(
    namespace: Annotated[
        str,
        typer.Option(
            help="The cache namespace the user may use, or a pattern: '<owner>.*' covers"
            " every version of one deployment."
        ),
    ],
) -> None:
    """Print the ACL SETUSER rules that confine a Redis user to one cache namespace or one
    deployment's (for its rankers and purge Jobs on a Redis shared with others)."""
    from kvrank_common import acl_rules

    typer.echo(" ".join(acl_rules(namespace)))


@cache_app.command("invalidate")
def cache_invalidate(
    user_id: Annotated[str, typer.Argument(help="User whose cached K/V to drop.")],
    namespace: Annotated[str, typer.Option(help="Cache namespace.")],
    model_version: Annotated[str, typer.Option(help="Model version.")],
    redis: Annotated[str, typer.Option(help="Redis URL.", envvar="KVRANK_REDIS_URL")],
    cluster: Annotated[bool, typer.Option(help="The URL is a Redis Cluster.")] = False,
) -> None:
    """Drop one user's cached K/V from L2 (pods' L1 entries expire with their TTL)."""
    import asyncio
    import os

    from kvrank.cache import RedisSettings, RedisStore

    async def run() -> int:
        store = RedisStore(
            RedisSettings(
                redis,
                cluster=cluster,
                op_timeout_s=2.0,
                password=os.environ.get("KVRANK_REDIS_PASSWORD"),
            )
        )
        try:
            return await store.delete_user(namespace, model_version, user_id)
        finally:
            await store.close()

    typer.echo(f"invalidated user {user_id!r}: {asyncio.run(run())} entries removed")


def main() -> None:
    """The ``kvrank`` entry point: a library missing from a base install is named with the
    extra that brings it, not shown as a traceback."""
    try:
        app()
    except ModuleNotFoundError as exc:
        if (exc.name or "kvrank").split(".")[0] == "kvrank":
            raise
        typer.secho(
            f"kvrank: {exc.name} is not installed; the data-plane commands need the ranker"
            " extra: pip install 'kvrank[ranker]'",
            fg=typer.colors.RED,
            err=True,
        )
        raise SystemExit(2) from exc
