"""``kubectl rkd``: a RankerDeployment's rollout from the command line.

Installed as the ``kubectl-rkd`` console script, which kubectl runs for ``kubectl rkd …``
(any executable named ``kubectl-<name>`` on PATH is a plugin). Like ``kubectl argo
rollouts``: ``status`` and ``watch`` read the object's status; ``promote``, ``abort``,
``pause`` and ``resume`` change its spec the way a person would with ``kubectl patch``, so
the operator does the rest and the spec says what happened; ``list`` names every
RankerDeployment of a namespace. ``status --wait [--timeout S]`` waits for the rollout to be
over and exits 0 (its version serving, Ready), 1 (aborted) or 2 (timed out), as
``kubectl argo rollouts status`` lets a CI step gate on it; ``-o json`` prints the object.
A missing kubeconfig or an unreachable API server is one line naming it:

- ``promote``: a stepped rollout moves one step on, as ``kubectl argo rollouts promote``
  does: ``canary.skipToStep`` is set to the step after the one in the status (a warm-up ends
  at step 1; past the last step the operator promotes), so running it twice before the
  operator moves still moves one step. ``promote --full``, or a canary without steps:
  ``model`` takes the canary's version, artifact and image and the canary block goes (the
  operator's own promotion, by the same patch).
- ``abort``: the canary block goes; the operator removes its pods and purges its cache
  namespace.
- ``pause`` / ``resume``: ``canary.paused`` holds a stepped rollout at its step / lets it on.

A GitOps tool would revert a changed spec: with ``canary.promotion: status`` the commands
that write the spec refuse (commit the change in Git instead) unless given ``--force``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
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
Context = Annotated[
    str | None, typer.Option(help="The kubeconfig context to use (default: its current one).")
]
Force = Annotated[
    bool, typer.Option(help="Write the spec even where canary.promotion is status (GitOps).")
]

app = typer.Typer(
    help="kvrank RankerDeployments: list, a rollout's status (--wait to gate on it), watch,"
    " promote, abort, pause, resume.",
    no_args_is_help=True,
    add_completion=False,
)


class RankerDeployments:
    """Reads and merge-patches of RankerDeployments in one namespace. (The operator's
    modules and the Kubernetes client are imported here, not with the module: a base install
    without the operator extra gets a message naming it, not a traceback.)"""

    def __init__(
        self, namespace: str | None, kubeconfig: str | None, context: str | None = None
    ) -> None:
        from kubernetes import client, config

        from kvrank_operator.crd import GROUP, PLURAL, VERSION

        try:
            config.load_kube_config(config_file=kubeconfig, context=context)
            contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
        except (config.ConfigException, OSError) as exc:
            fail(
                f"no usable kubeconfig ({exc}): pass --kubeconfig, set KUBECONFIG, or write"
                " ~/.kube/config"
            )
        if namespace is None:
            chosen = next((c for c in contexts if c["name"] == context), current)
            namespace = chosen["context"].get("namespace") or "default"
        self.namespace = namespace
        self.api = client.CustomObjectsApi()
        self.server = client.Configuration.get_default_copy().host
        self.where = (GROUP, VERSION, namespace, PLURAL)

    def call(self, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One API call; an unreachable or refusing API server is one line naming it."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return method(*args, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                fail(f"{what} not found in namespace {self.namespace}")
            fail(f"the API server at {self.server} refused: {exc.status} {exc.reason}")
        except HTTPError as exc:
            reason = getattr(exc, "reason", None) or type(exc).__name__
            fail(f"cannot reach the API server at {self.server}: {reason}")

    def get(self, name: str) -> dict[str, Any]:
        what = f"rankerdeployment {name}"
        found: dict[str, Any] = self.call(
            what, self.api.get_namespaced_custom_object, *self.where, name
        )
        return found

    def list(self) -> list[dict[str, Any]]:
        found = self.call("rankerdeployments", self.api.list_namespaced_custom_object, *self.where)
        return list(found.get("items") or [])

    def patch(self, name: str, patch: dict[str, Any]) -> None:
        self.call(
            f"rankerdeployment {name}",
            self.api.patch_namespaced_custom_object,
            *self.where,
            name,
            patch,
            _content_type="application/merge-patch+json",
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


Output = Annotated[
    str, typer.Option("--output", "-o", help="text (the default), or json: the object as is.")
]
DONE, FAILED, TIMED_OUT = 0, 1, 2
"""``status --wait``'s exit codes: the rollout ended with its version serving and Ready;
it was aborted (or the object deleted); the timeout passed first."""


@app.command()
def status(
    name: Name,
    namespace: Namespace = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    output: Output = "text",
    wait: Annotated[
        bool,
        typer.Option(
            help="Wait until the rollout is over, then exit 0 (promoted or no canary, and"
            " Ready), 1 (aborted) or 2 (the timeout passed): a CI step can gate on it."
        ),
    ] = False,
    timeout: Annotated[int, typer.Option(min=1, help="--wait: at most this many seconds.")] = 600,
) -> None:
    """Versions and their pods, the rollout (phase, step, weight, checks), the cache
    namespaces, the TTL and the conditions."""
    if output not in ("text", "json"):
        fail(f"--output must be text or json, not {output!r}")
    rkds = RankerDeployments(namespace, kubeconfig, context)
    obj = rkds.get(name)
    if wait:
        obj = _until_over(rkds, name, obj, timeout)
    _print(obj, output)
    if wait:
        raise typer.Exit(DONE if verdict(obj) == "done" else FAILED)


def _until_over(rkds: RankerDeployments, name: str, obj: dict[str, Any], timeout: int) -> Any:
    """The object once its rollout is over (:func:`verdict`); exit 2 after ``timeout``."""
    deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=timeout)
    while verdict(obj) is None:
        left = int((deadline - dt.datetime.now(dt.UTC)).total_seconds())
        if left <= 0:
            _print(obj, "text")
            typer.echo(f"kubectl rkd: {name}: the rollout was not over after {timeout}s", err=True)
            raise typer.Exit(TIMED_OUT)
        for event in rkds.watch(name, min(left, 60)):
            if event["type"] == "DELETED":
                fail(f"rankerdeployment {name} was deleted")
            obj = event["object"]
            if verdict(obj) is not None:
                break
    return obj


def verdict(obj: dict[str, Any]) -> str | None:
    """``done`` (no canary left and Ready), ``aborted`` (the rollout's record says so), or
    ``None``: still going."""
    status = obj.get("status") or {}
    if (status.get("canary") or {}).get("phase") == "Aborted":
        return "aborted"
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return "done" if ready and not (obj.get("spec") or {}).get("canary") else None


def _print(obj: dict[str, Any], output: str) -> None:
    if output == "json":
        (obj.get("metadata") or {}).pop("managedFields", None)
        typer.echo(json.dumps(obj, indent=2, default=str))
    else:
        _show(obj)


@app.command("list")
def list_(
    namespace: Namespace = None, kubeconfig: Kubeconfig = None, context: Context = None
) -> None:
    """Every RankerDeployment in the namespace: its version, canary, phase, readiness, URL."""
    rkds = RankerDeployments(namespace, kubeconfig, context)
    table = Table("NAME", "VERSION", "CANARY", "PHASE", "READY", "URL", box=None)
    for obj in sorted(rkds.list(), key=lambda o: o["metadata"]["name"]):
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        canary, rollout = spec.get("canary") or {}, status.get("canary") or {}
        phase = rollout.get("phase", "-") if canary else "-"
        table.add_row(
            obj["metadata"]["name"], (spec.get("model") or {}).get("version", "-"),
            canary.get("version", "-"), phase, status.get("readyText", "-"),
            status.get("url", "-"),
        )  # fmt: skip
    Console(width=240, soft_wrap=True, highlight=False).print(table)


@app.command()
def watch(
    name: Name,
    namespace: Namespace = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    timeout: Annotated[
        int | None, typer.Option(help="Stop after this many seconds (default: on Ctrl-C).")
    ] = None,
) -> None:
    """``status`` again each time the object changes."""
    rkds = RankerDeployments(namespace, kubeconfig, context)
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
    name: Name,
    namespace: Namespace = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    force: Force = False,
    full: Annotated[
        bool, typer.Option("--full", help="Promote now, every remaining step skipped.")
    ] = False,
) -> None:
    """Move a stepped rollout one step on (its checks and pause skipped; a warm-up ended;
    after the last step, promoted); a canary without steps, or with --full: promote now."""
    rkds = RankerDeployments(namespace, kubeconfig, context)
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
    if full or not spec.canary.steps:
        rkds.patch(name, promotion(spec.canary))
        typer.echo(f"{name}: promoted canary {canary['version']} (was {spec.model.version})")
        return
    target, now = _next_step(obj, canary["version"], len(spec.canary.steps))
    rkds.patch(name, {"spec": {"canary": {"skipToStep": target}}})
    to = "promoted after its last step" if target > len(spec.canary.steps) else f"step {target}"
    typer.echo(f"{name}: canary {canary['version']} {now} → {to}")


def _next_step(obj: dict[str, Any], version: str, steps: int) -> tuple[int, str]:
    """The step after the rollout's current one, and where it is now (from its status)."""
    rollout = (obj.get("status") or {}).get("canary") or {}
    name = obj["metadata"]["name"]
    phase = rollout.get("phase", "Starting") if rollout.get("version") == version else "Starting"
    if phase in ("Starting", "Warming"):
        return 1, phase.lower()
    if phase != "Progressing":
        fail(f"{name}'s rollout of canary {version} is {phase}: nothing to move on")
    step = int(rollout.get("step") or 1)
    return step + 1, f"step {step}/{steps}"


@app.command()
def abort(
    name: Name,
    namespace: Namespace = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    force: Force = False,
) -> None:
    """Remove the canary: its pods go, its cache namespace is purged."""
    rkds = RankerDeployments(namespace, kubeconfig, context)
    canary = _canary(rkds.get(name), force, "abort")
    rkds.patch(name, {"spec": {"canary": None}})
    typer.echo(f"{name}: aborted canary {canary['version']}")


def _hold(name: str, where: tuple[str | None, str | None, str | None], paused: bool) -> None:
    rkds = RankerDeployments(*where)
    canary = _canary(rkds.get(name), True, "pause" if paused else "resume")
    if not canary.get("steps"):
        fail(f"{name}'s canary has no steps: it stays at its weight until promoted or aborted")
    rkds.patch(name, {"spec": {"canary": {"paused": paused}}})
    typer.echo(f"{name}: canary {canary['version']} {'paused' if paused else 'resumed'}")


@app.command()
def pause(
    name: Name, namespace: Namespace = None, kubeconfig: Kubeconfig = None, context: Context = None
) -> None:
    """Hold a stepped rollout at its step (checks still run; a failing one still aborts)."""
    _hold(name, (namespace, kubeconfig, context), True)


@app.command()
def resume(
    name: Name, namespace: Namespace = None, kubeconfig: Kubeconfig = None, context: Context = None
) -> None:
    """Let a paused rollout go on."""
    _hold(name, (namespace, kubeconfig, context), False)


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
