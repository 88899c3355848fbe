"""``kubectl rkd``: a RankerDeployment's rollout from the command line.

Installed as the ``kubectl-rkd`` console script, which kubectl runs for ``kubectl rkd …``
(any executable named ``kubectl-<name>`` on PATH is a plugin). Like ``kubectl argo
rollouts``: ``status`` and ``watch`` read the object's status; ``promote``, ``abort``,
``pause`` and ``resume`` change its spec the way a person would with ``kubectl patch``, so
the operator does the rest and the spec says what happened:

- ``promote``: ``model`` takes the canary's version, artifact and image and the canary block
  goes (the operator's own promotion, by the same patch); a stepped rollout skips its steps.
- ``abort``: the canary block goes; the operator removes its pods and purges its cache
  namespace.
- ``pause`` / ``resume``: ``canary.paused`` holds a stepped rollout at its step / lets it on.

A GitOps tool would revert a changed spec: with ``canary.promotion: status`` the commands
that write the spec refuse (commit the change in Git instead) unless given ``--force``.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

Name = Annotated[str, typer.Argument(help="The RankerDeployment.")]
Namespace = Annotated[
    str | None,
    typer.Option("--namespace", "-n", help="Its namespace (default: the context's)."),
]
Kubeconfig = Annotated[
    str | None, typer.Option(help="Kubeconfig (default: $KUBECONFIG, then ~/.kube/config).")
]
Force = Annotated[
    bool, typer.Option(help="Write the spec even where canary.promotion is status (GitOps).")
]

app = typer.Typer(
    help="kvrank RankerDeployments: a rollout's status, promote, abort, pause, resume.",
    no_args_is_help=True,
    add_completion=False,
)


class RankerDeployments:
    """Reads and merge-patches of RankerDeployments in one namespace. (The operator's
    modules and the Kubernetes client are imported here, not with the module: a base install
    without the operator extra gets a message naming it, not a traceback.)"""

    def __init__(self, namespace: str | None, kubeconfig: str | None) -> None:
        from kubernetes import client, config

        from kvrank_operator.crd import GROUP, PLURAL, VERSION

        config.load_kube_config(config_file=kubeconfig)
        if namespace is None:
            _, context = config.list_kube_config_contexts(config_file=kubeconfig)
            namespace = context["context"].get("namespace") or "default"
        self.namespace = namespace
        self.api = client.CustomObjectsApi()
        self.where = (GROUP, VERSION, namespace, PLURAL)

    def get(self, name: str) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        try:
            obj = self.api.get_namespaced_custom_object(*self.where, name)
        except ApiException as exc:
            if exc.status == 404:
                fail(f"rankerdeployment {name} not found in namespace {self.namespace}")
            raise
        found: dict[str, Any] = obj  # type: ignore[assignment]  # the client says object
        return found

    def patch(self, name: str, patch: dict[str, Any]) -> None:
        self.api.patch_namespaced_custom_object(
            *self.where, name, patch, _content_type="application/merge-patch+json"
        )

    def watch(self, name: str, timeout_s: int | None) -> Any:
        from kubernetes import watch

        return watch.Watch().stream(
            self.api.list_namespaced_custom_object,
            *self.where,
            field_selector=f"metadata.name={name}",
            timeout_seconds=timeout_s,
        )


def fail(message: str) -> NoReturn:
    typer.echo(f"kubectl rkd: {message}", err=True)
    raise typer.Exit(1)


def describe(obj: dict[str, Any]) -> Group:
    """What ``status`` prints of a RankerDeployment: its versions, rollout, checks, cache
    namespaces, TTL (short cells in one borderless table), then the rollout's message and
    the conditions, a line each (messages are long: they end their lines)."""
    meta, spec, status = obj["metadata"], obj.get("spec", {}), obj.get("status") or {}
    table = Table.grid(padding=(0, 2))
    for _ in range(6):
        table.add_column(no_wrap=True)
    table.add_row("Name", f"{meta['name']} ({meta.get('namespace', '')})")
    table.add_row("URL", status.get("url", "-"))
    table.add_row("Ready", status.get("readyText", "-"))
    canary = status.get("canary") or {}
    live = canary and not canary.get("ended")
    for v in status.get("versions") or []:
        weight = f"{canary.get('weight', 0)}%" if v.get("role") == "canary" and live else ""
        ready = f"{v.get('readyReplicas', 0)}/{v.get('replicas', 0)} ready"
        table.add_row("Version", v["version"], v.get("role", ""), ready, weight)
    lines: list[str] = []
    if canary:
        _rollout(table, canary, bool((spec.get("canary") or {}).get("paused")))
        lines.append(f"Rollout: {canary.get('message', '')}")
    for ns in status.get("cacheNamespaces") or []:
        when = ns.get("purgeAfter") and f"purge after {ns['purgeAfter']}"
        table.add_row(
            "Cache", ns["namespace"], ns["version"], ns.get("role", ""), ns["state"], when or ""
        )
    if ttl := status.get("ttl"):
        mean = ttl.get("meanIntervalSeconds")
        interval = "" if mean is None else f"mean interval {mean:.1f}s"
        table.add_row("TTL", f"{ttl['seconds']:g}s", ttl.get("source", ""), interval)
    if (hits := status.get("hitRatio")) is not None:
        table.add_row("Hit ratio", f"{hits:.3f}", f"at {status.get('observedAt', '-')}")
    for c in status.get("conditions") or []:
        reason = f" {c['reason']}" if c.get("reason") else ""
        lines.append(f"Condition {c['type']} {c['status']}{reason}: {c.get('message', '')}")
    return Group(table, *(Text(line) for line in lines))


def _rollout(table: Table, canary: dict[str, Any], paused: bool) -> None:
    """The rollout's row (version, phase, step, weight, since) and one row per check."""
    phase = canary["phase"] + (" (ended)" if canary.get("ended") else "")
    table.add_row(
        "Rollout", canary["version"], phase + (" paused" if paused else ""),
        canary.get("stepText") or "", f"{canary.get('weight', 0)}%",
        f"since {canary.get('since', '-')}",
    )  # fmt: skip
    for check in canary.get("checks") or []:
        value = check.get("value")
        bound = (f"max {check['max']:g}" if "max" in check else "") or (
            f"min {check['min']:g}" if "min" in check else ""
        )
        samples = f"{check.get('samples', 0)}/{check.get('minSamples', 0)} samples"
        shown = "-" if value is None else f"{value:.4g}"
        table.add_row("Check", check["metric"], shown, bound, samples, check["result"])


def _show(obj: dict[str, Any]) -> None:
    Console(width=240, soft_wrap=True, highlight=False).print(describe(obj))


@app.command()
def status(name: Name, namespace: Namespace = None, kubeconfig: Kubeconfig = None) -> None:
    """Versions and their pods, the rollout (phase, step, weight, checks), the cache
    namespaces, the TTL and the conditions."""
    _show(RankerDeployments(namespace, kubeconfig).get(name))


@app.command()
def watch(
    name: Name,
    namespace: Namespace = None,
    kubeconfig: Kubeconfig = None,
    timeout: Annotated[
        int | None, typer.Option(help="Stop after this many seconds (default: on Ctrl-C).")
    ] = None,
) -> None:
    """``status`` again each time the object changes."""
    rkds = RankerDeployments(namespace, kubeconfig)
    seen = None
    for event in rkds.watch(name, timeout):
        obj = event["object"]
        if event["type"] == "DELETED":
            fail(f"rankerdeployment {name} was deleted")
        version = obj["metadata"]["resourceVersion"]
        if version != seen:
            seen = version
            stamp = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
            typer.echo(f"--- {stamp} (resourceVersion {version})")
            _show(obj)


def _canary(obj: dict[str, Any], force: bool, verb: str) -> dict[str, Any]:
    canary: dict[str, Any] | None = obj.get("spec", {}).get("canary")
    name = obj["metadata"]["name"]
    if canary is None:
        fail(f"{name} has no canary to {verb}")
    if canary.get("promotion") == "status" and not force:
        fail(
            f"{name}'s canary promotes by status (GitOps): change the spec in Git, or pass"
            " --force to write it here (a GitOps tool may revert it)"
        )
    return canary


@app.command()
def promote(
    name: Name, namespace: Namespace = None, kubeconfig: Kubeconfig = None, force: Force = False
) -> None:
    """Make the canary the stable version now (remaining steps skipped)."""
    rkds = RankerDeployments(namespace, kubeconfig)
    from kvrank_operator.errors import SpecError
    from kvrank_operator.rollout import promotion
    from kvrank_operator.spec import parse_spec

    obj = rkds.get(name)
    canary = _canary(obj, force, "promote")
    try:
        spec = parse_spec(obj["spec"])
    except SpecError as exc:
        fail(f"{name}'s spec is not one the operator serves: {exc}")
    assert spec.canary is not None
    rkds.patch(name, promotion(spec.canary))
    typer.echo(f"{name}: promoted canary {canary['version']} (was {spec.model.version})")


@app.command()
def abort(
    name: Name, namespace: Namespace = None, kubeconfig: Kubeconfig = None, force: Force = False
) -> None:
    """Remove the canary: its pods go, its cache namespace is purged."""
    rkds = RankerDeployments(namespace, kubeconfig)
    canary = _canary(rkds.get(name), force, "abort")
    rkds.patch(name, {"spec": {"canary": None}})
    typer.echo(f"{name}: aborted canary {canary['version']}")


def _hold(name: str, namespace: str | None, kubeconfig: str | None, paused: bool) -> None:
    rkds = RankerDeployments(namespace, kubeconfig)
    canary = _canary(rkds.get(name), True, "pause" if paused else "resume")
    if not canary.get("steps"):
        fail(f"{name}'s canary has no steps: it stays at its weight until promoted or aborted")
    rkds.patch(name, {"spec": {"canary": {"paused": paused}}})
    typer.echo(f"{name}: canary {canary['version']} {'paused' if paused else 'resumed'}")


@app.command()
def pause(name: Name, namespace: Namespace = None, kubeconfig: Kubeconfig = None) -> None:
    """Hold a stepped rollout at its step (checks still run; a failing one still aborts)."""
    _hold(name, namespace, kubeconfig, True)


@app.command()
def resume(name: Name, namespace: Namespace = None, kubeconfig: Kubeconfig = None) -> None:
    """Let a paused rollout go on."""
    _hold(name, namespace, kubeconfig, False)


def main() -> None:
    try:
        app()
    except ModuleNotFoundError as exc:
        typer.echo(
            f"kubectl rkd needs the operator extra ({exc.name} is missing):"
            " pip install 'kvrank[operator]'",
            err=True,
        )
        raise SystemExit(2) from exc


if __name__ == "__main__":
    main()
