"""The operator's Helm release, as a platform engineer handles it: install, upgrade,
``helm test``, uninstall; who leads, what it wrote, and what the chart's monitoring holds.

The end-to-end fixtures install the release on demand (:meth:`OperatorRelease.ensure`), so
any scenario runs alone; the install/upgrade and uninstall scenarios drive it themselves.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from chart import CHART, OPERATOR_NS, OPERATOR_SELECTOR, RELEASE
from prometheus_client.parser import text_string_to_metric_families
from stack import NS, Stack

WRITE_VERBS = {"POST", "PUT", "PATCH", "APPLY", "DELETE"}
CRD = "rankerdeployments.kvrank.io"


class OperatorRelease:
    """The ``kvrank`` release in the operator's namespace, with this run's operator image."""

    install_timeout_s = 300

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.cluster = stack.cluster

    def values(self, chart: Path = CHART) -> list[str]:
        """``--set`` arguments: the images this run built, never pulled — the operator's, and
        (this tree's chart) the defaults of a spec that names none, as an air-gapped site
        sets them (``examples/quickstart.yaml`` names no Redis image)."""
        images = self.stack.images
        repo, tag = images.operator.rsplit(":", 1)
        values = ["logLevel=INFO", f"image.repository={repo}", f"image.tag={tag}",
                  "image.pullPolicy=Never"]  # fmt: skip
        if chart == CHART:  # the previous release's chart has no defaultImages
            for key, ref in (("ranker", images.ranker), ("redis", images.redis),
                             ("router", images.router)):  # fmt: skip
                repo, tag = ref.rsplit(":", 1)
                values += [
                    f"defaultImages.{key}.repository={repo}",
                    f"defaultImages.{key}.tag={tag}",
                ]
        return [arg for v in values for arg in ("--set", v)]

    # ------------------------------------------------------------------ lifecycle
    def installed(self) -> bool:
        out = self.cluster.helm("status", RELEASE, "--namespace", OPERATOR_NS, check=False)
        return out.returncode == 0 and "STATUS: deployed" in out.stdout

    def ensure(self) -> None:
        """This tree's chart installed (a scenario that needs the operator, run alone)."""
        if not self.installed():
            self.cluster.helm("uninstall", RELEASE, "--namespace", OPERATOR_NS, check=False)
            self.install()

    def install(self, chart: Path = CHART) -> None:
        self.cluster.helm(
            "install", RELEASE, str(chart), "--namespace", OPERATOR_NS, *self.values(chart),
            "--wait", f"--timeout={self.install_timeout_s}s",
        )  # fmt: skip

    def upgrade(self) -> None:
        """``helm upgrade`` the release to this tree's chart."""
        self.cluster.helm(
            "upgrade", RELEASE, str(CHART), "--namespace", OPERATOR_NS, *self.values(),
            "--wait", f"--timeout={self.install_timeout_s}s",
        )  # fmt: skip

    def uninstall(self) -> None:
        self.cluster.helm(
            "uninstall", RELEASE, "--namespace", OPERATOR_NS, "--wait", "--timeout=300s"
        )

    def remove_with_crd(self) -> None:
        """No release and no CRD: a cluster kvrank was never installed on (the CRD's
        RankerDeployments go with it; the uninstall hook has taken their finalizers off)."""
        if self.installed():
            self.uninstall()
        self.stack.kubectl("delete", "crd", CRD, "--ignore-not-found", "--timeout=120s")

    def helm_test(self, ranker: str) -> str:
        """``helm upgrade`` the release to check ``ranker``'s Service too, then ``helm test``;
        returns the test pod's log."""
        sets = [f"test.rankerDeployment.name={ranker}", f"test.rankerDeployment.namespace={NS}"]
        extra = [arg for v in sets for arg in ("--set", v)]
        self.cluster.helm(
            "upgrade", RELEASE, str(CHART), "--namespace", OPERATOR_NS, *self.values(), *extra
        )
        out = self.cluster.helm(
            "test", RELEASE, "--namespace", OPERATOR_NS, "--logs", "--timeout=180s", check=False
        )
        assert out.returncode == 0, f"helm test failed:\n{out.stdout}\n{out.stderr}"
        return out.stdout

    # ------------------------------------------------------------------ its pods
    def pods(self) -> list[dict[str, Any]]:
        return self.stack.select("pods", OPERATOR_SELECTOR, OPERATOR_NS)

    def leader(self) -> str | None:
        """The operator pod that holds the Lease (holder identity ``<pod>_<random>``)."""
        leases = json.loads(self.stack.kubectl("get", "leases", "-n", OPERATOR_NS, "-o", "json"))
        holders = [(i.get("spec") or {}).get("holderIdentity") for i in leases["items"]]
        held = [h for h in holders if h]
        assert len(held) <= 1, f"more than one operator Lease held: {held}"
        return held[0].rsplit("_", 1)[0] if held else None

    def kill_pod(self, pod: str) -> None:
        """Kill an operator pod at once: no grace period, so no clean hand-over of its Lease;
        its Deployment starts a new pod."""
        self.stack.kubectl(
            "delete", "pod", pod, "-n", OPERATOR_NS, "--grace-period=0", "--force", "--wait=false"
        )

    @property
    def service_account(self) -> str:
        (dep,) = json.loads(
            self.stack.kubectl(
                "get", "deployments", "-n", OPERATOR_NS, "-l", OPERATOR_SELECTOR, "-o", "json"
            )
        )["items"]
        return str(dep["spec"]["template"]["spec"]["serviceAccountName"])

    # ------------------------------------------------------------------ what it wrote
    def writes(self, since: dt.datetime) -> list[tuple[dt.datetime, str, str]]:
        """Every write the operator's pods made since ``since``, from the API server's audit
        log: ``(time received, pod, "verb resource[/sub] namespace/name")``, oldest first.
        The pod is the one the request's ServiceAccount token was bound to."""
        user = f"system:serviceaccount:{OPERATOR_NS}:{self.service_account}"
        writes = []
        for event in self.cluster.audit_events():
            if event["user"]["username"] != user:
                continue
            at = dt.datetime.fromisoformat(event["requestReceivedTimestamp"])
            if at < since:
                continue
            pod = (event["user"].get("extra") or {}).get("authentication.kubernetes.io/pod-name")
            ref = event.get("objectRef") or {}
            sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
            target = f"{ref.get('namespace')}/{ref.get('name')}"
            what = f"{event['verb']} {ref.get('resource')}{sub} {target}"
            writes.append((at, pod[0] if pod else "?", what))
        return sorted(writes)


def api_writes(stack: Stack, resources: set[str]) -> dict[str, float]:
    """Write requests the API server has served so far, by ``verb resource[/sub]``, for
    ``resources`` (its ``apiserver_request_total``)."""
    text = stack.kubectl("get", "--raw", "/metrics")
    writes: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name != "apiserver_request_total":
                continue
            if labels.get("verb") not in WRITE_VERBS or labels.get("resource") not in resources:
                continue
            sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
            key = f"{labels['verb']} {labels['resource']}{sub}"
            writes[key] = writes.get(key, 0.0) + sample.value
    return writes
