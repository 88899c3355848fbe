"""The ``kvrank`` command line: train, bench, demo, and (as they land) serve/loadtest/cache.

A thin shell: it parses options, reads nothing at import time, and hands off to the
library (``kvrank.train``, ``kvrank.bench``). Heavy imports (torch) happen inside the
commands so that ``kvrank --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="kvrank: ranking with a cached user-side K/V (data-plane tools).",
    no_args_is_help=True,
    add_completion=False,
)
cache_app = typer.Typer(help="Cache administration (purge a namespace, invalidate a user).")
app.add_typer(cache_app, name="cache")

PROFILES = ("quick", "seed")


def _not_built(what: str, needs: str) -> None:
    typer.secho(
        f"kvrank {what} is not available in this build: it needs {needs}, which has not"
        " landed yet.",
        fg=typer.colors.YELLOW,
        err=True,
    )
    raise typer.Exit(code=2)


@app.command()
def train(
    out: Annotated[Path, typer.Option(help="Artifact directory to write.")] = Path(
        "artifacts/quick"
    ),
    profile: Annotated[str, typer.Option(help="Model size: quick or seed.")] = "quick",
    steps: Annotated[int, typer.Option(min=1, help="Optimizer steps.")] = 300,
    version: Annotated[str, typer.Option(help="Model version string.")] = "v1",
    seed: Annotated[int, typer.Option(help="Synthetic-world seed.")] = 0,
) -> None:
    """Train the ranker on synthetic data, report held-out AUC, write an artifact."""
    from kvrank.jobs import train_and_save

    train_and_save(out, profile, steps, version, seed)


@app.command()
def bench(
    profile: Annotated[str, typer.Option(help="quick (seconds) or seed (brief sizes).")] = "quick",
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    candidates: Annotated[
        str | None, typer.Option(help="Comma-separated candidate counts, e.g. 50,100,200.")
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a latency-vs-C PNG here.")] = None,
    model: Annotated[
        Path | None, typer.Option(help="Trained artifact for the INT8 AUC check.")
    ] = None,
) -> None:
    """Measure nocache / miss / hit / int8 / incremental scoring side by side."""
    from kvrank.bench.runner import run_bench

    counts = [int(c) for c in candidates.split(",")] if candidates else None
    if profile not in PROFILES:
        raise typer.BadParameter(f"profile must be one of {PROFILES}", param_hint="--profile")
    run_bench(profile, device, counts, json_out, plot, model)


@app.command()
def demo(
    model: Annotated[
        Path, typer.Option(help="Artifact to use; trained here first if missing.")
    ] = Path("artifacts/quick"),
) -> None:
    """Train or load the small model and show cached vs. uncached scoring."""
    from kvrank.jobs import run_demo

    run_demo(model)


@app.command()
def serve() -> None:
    """Run the scoring server (FastAPI, two-level cache)."""
    _not_built("serve", "the scoring server and two-level cache")


@app.command()
def loadtest() -> None:
    """Replay a workload against cache-enabled and cache-disabled servers."""
    _not_built("loadtest", "the scoring server and two-level cache")


@cache_app.command("purge")
def cache_purge() -> None:
    """Remove every key of one cache namespace from Redis."""
    _not_built("cache purge", "the Redis cache tier")


@cache_app.command("invalidate")
def cache_invalidate() -> None:
    """Drop one user's cached K/V."""
    _not_built("cache invalidate", "the Redis cache tier")


def main() -> None:
    app()
