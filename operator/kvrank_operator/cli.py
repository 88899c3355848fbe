"""The ``kvrank-operator`` command line (a thin shell; reconciliation lives elsewhere)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from kvrank_operator import __version__

if TYPE_CHECKING:
    from kvrank_operator.manifests import PodMonitoring
    from kvrank_operator.reconcile import Options
    from kvrank_operator.spec import Defaults

RankerImage = Annotated[
    str | None,
    typer.Option(help="The ranker image of a spec that names none (default: kvrank's own)."),
]
RedisImage = Annotated[
    str | None,
    typer.Option(help="The managed Redis image of a spec that names none (default redis:7.2)."),
]
OperatorNamespace = Annotated[
    str | None,
    typer.Option(
        envvar="POD_NAMESPACE",
        help="The namespace the operator runs in: a managed Redis admits the operator's pods"
        " from it only (unset: from any namespace, for an operator run outside the cluster).",
    ),
]
RouterImage = Annotated[
    str | None, typer.Option(help="The bundled router image of a spec that names none.")
]
PlatformIds = Annotated[
    bool,
    typer.Option(
        help="Leave runAsUser/runAsGroup/fsGroup unset on the pods made (OpenShift's"
        " restricted-v2 SCC assigns them from the namespace's range)."
    ),
]
"""What a spec leaves to the operator (``run`` and ``render`` take the same four)."""
Lease = Annotated[
    str,
    typer.Option(
        help="Elect a leader among replicas on this Lease (empty: this replica always leads)."
    ),
]
LeaseNamespace = Annotated[
    str,
    typer.Option(
        envvar="POD_NAMESPACE", help="Namespace of the Lease (default: the operator's own)."
    ),
]

app = typer.Typer(
    help="kvrank operator: RankerDeployment → ranker pods + Redis, canary caches, TTL tuning.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def run(
    kubeconfig: Annotated[
        str | None, typer.Option(help="Kubeconfig (default: in-cluster, then ~/.kube/config).")
    ] = None,
    namespace: Annotated[
        list[str] | None, typer.Option(help="Watch only these namespaces (repeatable).")
    ] = None,
    metrics_port: Annotated[int, typer.Option(help="Prometheus metrics port (0: off).")] = 8000,
    liveness_port: Annotated[int, typer.Option(help="Health endpoint port (0: off).")] = 8081,
    lease: Lease = "",
    lease_namespace: LeaseNamespace = "",
    log_format: Annotated[
        str, typer.Option(envvar="LOG_FORMAT", help="json (one object per line) or text.")
    ] = "json",
    pod_monitor: Annotated[
        bool,
        typer.Option(
            help="A prometheus-operator PodMonitor per RankerDeployment (when the cluster"
            " serves the kind; its Monitoring condition says when not)."
        ),
    ] = False,
    pod_monitor_label: Annotated[
        list[str] | None,
        typer.Option(help="KEY=VALUE label on every PodMonitor (repeatable).", metavar="KEY=VALUE"),
    ] = None,
    pod_monitor_interval: Annotated[
        str, typer.Option(help="Scrape interval of the PodMonitors.")
    ] = "30s",
    ranker_image: RankerImage = None,
    redis_image: RedisImage = None,
    router_image: RouterImage = None,
    platform_ids: PlatformIds = False,
    operator_namespace: OperatorNamespace = None,
) -> None:
    """Run the operator (cluster-wide unless --namespace is given)."""
    import os

    if kubeconfig:  # before the kubernetes client is imported: it reads this once
        os.environ["KUBECONFIG"] = kubeconfig
    if log_format not in ("json", "text"):
        raise typer.BadParameter("json or text", param_hint="--log-format")
    _configure_logging(log_format)
    from kvrank_operator.reconcile import Options
    from kvrank_operator.redis_cluster import check_and_heal

    monitoring = None
    if pod_monitor:
        monitoring = _pod_monitoring(pod_monitor_label or [], pod_monitor_interval)
    defaults = _defaults(ranker_image, redis_image, router_image, platform_ids, operator_namespace)
    options = Options(redis_health=check_and_heal, monitoring=monitoring, defaults=defaults)
    _serve(
        kubeconfig, namespace or [], metrics_port, liveness_port, lease, lease_namespace, options
    )


def _defaults(
    ranker: str | None,
    redis: str | None,
    router: str | None,
    platform_ids: bool,
    operator_namespace: str | None = None,
) -> Defaults:
    from kvrank_operator.spec import Defaults

    given = {"ranker": ranker, "redis": redis, "router": router}
    return Defaults(
        **{k: v for k, v in given.items() if v},
        platform_ids=platform_ids,
        operator_namespace=operator_namespace or None,
    )


def _configure_logging(log_format: str) -> None:
    import logging
    import os

    import kopf

    # kopf's formatter: with json, each line is an object that names the resource it is about
    kopf.configure(
        log_format=kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.FULL,
        log_refkey="k8s",
    )
    logging.getLogger().setLevel(os.environ.get("LOG_LEVEL", "INFO"))


def _pod_monitoring(pairs: list[str], interval: str) -> PodMonitoring:
    from kvrank_operator.manifests import PodMonitoring

    return PodMonitoring(_labels(pairs), interval)


def _serve(
    kubeconfig: str | None,
    namespaces: list[str],
    metrics_port: int,
    liveness_port: int,
    lease: str,
    lease_namespace: str,
    options: Options,
) -> None:
    """Lead (when electing), then run kopf with the operator's context in its ``memo``."""
    import asyncio
    import contextlib

    import kopf
    from prometheus_client import start_http_server

    from kvrank_operator.handlers import OperatorContext
    from kvrank_operator.kube import Kube, load_client
    from kvrank_operator.leader import Election, ElectionSettings, FollowerHealth

    context = OperatorContext(Kube(load_client(kubeconfig)), options)
    if metrics_port:
        start_http_server(metrics_port, registry=context.metrics.registry)
    election = None
    if lease:
        settings = ElectionSettings(lease=lease, namespace=lease_namespace or _own_namespace())
        election = Election(settings, context.kube.api, metrics=context.metrics).start()
        health = FollowerHealth(liveness_port, election) if liveness_port else None
        with health or contextlib.nullcontext():
            election.elected.wait()
    liveness = f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None
    try:
        asyncio.run(
            kopf.operator(
                clusterwide=not namespaces,
                namespaces=namespaces,
                standalone=True,
                liveness_endpoint=liveness,
                memo=kopf.Memo(operator=context),
            )
        )
    finally:
        if election is not None:
            election.release()


def _labels(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(
                f"{pair!r}: expected KEY=VALUE", param_hint="--pod-monitor-label"
            )
        out[key] = value
    return out


def _own_namespace() -> str:
    """The pod's namespace, from its service account mount."""
    from pathlib import Path

    mounted = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if not mounted.exists():
        raise typer.BadParameter("no namespace for the Lease: pass --lease-namespace")
    return mounted.read_text().strip()


@app.command("release-finalizers")
def release_finalizers(
    operator: Annotated[
        str | None,
        typer.Option(help="namespace/name of the operator's Deployment, stopped first."),
    ] = None,
    namespace: Annotated[
        list[str] | None, typer.Option(help="Only these namespaces (repeatable).")
    ] = None,
    kubeconfig: Annotated[
        str | None, typer.Option(help="Kubeconfig (default: in-cluster).")
    ] = None,
) -> None:
    """Before uninstalling: stop the operator, then take its finalizer off every
    RankerDeployment so they stay deletable (they and their pods keep running)."""
    import logging

    from kvrank_operator.kube import Kube, load_client
    from kvrank_operator.release import release_finalizers as release
    from kvrank_operator.release import stop_operator

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(message)s")
    kube = Kube(load_client(kubeconfig))
    if operator:
        ns, _, name = operator.partition("/")
        stop_operator(kube, ns, name)
    count = release(kube, namespace or [])
    typer.echo(f"released {count} RankerDeployment(s)")


@app.command()
def crd(
    reference: Annotated[
        bool,
        typer.Option(
            "--reference", help="Print the reference page (Markdown) generated from the schema."
        ),
    ] = False,
) -> None:
    """Print the RankerDeployment CRD as YAML (the chart's crds/ file is generated from it)."""
    if reference:
        from kvrank_operator.crd_reference import markdown

        typer.echo(markdown(), nl=False)
        return
    import yaml

    from kvrank_operator.crd import crd as build

    typer.echo(yaml.safe_dump(build(), sort_keys=False), nl=False)


@app.command()
def render(
    file: Annotated[
        str,
        typer.Option(
            "--filename",
            "-f",
            help="RankerDeployment YAML (- for standard input); every document in it.",
        ),
    ],
    namespace: Annotated[
        str | None,
        typer.Option(help="Namespace to render into (default: the document's, else default)."),
    ] = None,
    pod_monitor: Annotated[
        bool, typer.Option(help="Add the PodMonitor an operator run with --pod-monitor adds.")
    ] = False,
    ranker_image: RankerImage = None,
    redis_image: RedisImage = None,
    router_image: RouterImage = None,
    platform_ids: PlatformIds = False,
    operator_namespace: OperatorNamespace = None,
) -> None:
    """Print the objects the operator would apply for a RankerDeployment (its first pass;
    Secrets' values redacted): for review, diffs and manifest linters. No cluster needed."""
    import sys
    from pathlib import Path

    import yaml

    from kvrank_operator.errors import OperatorError
    from kvrank_operator.render import render as build

    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
        monitoring = _pod_monitoring([], "30s") if pod_monitor else None
        defaults = _defaults(
            ranker_image, redis_image, router_image, platform_ids, operator_namespace
        )
        objects = [obj for doc in docs for obj in build(doc, namespace, monitoring, defaults)]
    except (OSError, yaml.YAMLError, OperatorError) as exc:
        typer.echo(f"kvrank-operator render: {file}: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(yaml.safe_dump_all(objects, sort_keys=False), nl=False)


@app.command()
def version() -> None:
    """Print the operator version."""
    typer.echo(__version__)


def main() -> None:
    """The ``kvrank-operator`` entry point: a library missing from a base install is named
    with the extra that brings it, not shown as a traceback."""
    try:
        app()
    except ModuleNotFoundError as exc:
        if (exc.name or "kvrank_operator").split(".")[0] == "kvrank_operator":
            raise
        typer.secho(
            f"kvrank-operator: {exc.name} is not installed; the operator needs its extra:"
            " pip install 'kvrank[operator]'",
            fg=typer.colors.RED,
            err=True,
        )
        raise SystemExit(2) from exc
