"""The ``kvrank-operator`` command line (a thin shell; reconciliation lives elsewhere)."""

from __future__ import annotations

import typer

from kvrank_operator import __version__

app = typer.Typer(
    help="kvrank operator: RankerDeployment → ranker pods + Redis, canary caches, TTL tuning.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def run() -> None:
    """Run the operator against the current kubeconfig or in-cluster config."""
    typer.secho(
        "kvrank-operator run is not available in this build: the reconciler has not landed yet.",
        fg=typer.colors.YELLOW,
        err=True,
    )
    raise typer.Exit(code=2)


@app.command()
def version() -> None:
    """Print the operator version."""
    typer.echo(__version__)


def main() -> None:
    app()
