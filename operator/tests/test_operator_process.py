"""The ``kvrank-operator run`` process against the session's real API server: it takes its
Lease, answers its liveness probe, reconciles a RankerDeployment in its namespace and
counts what happens to it in its metrics (an aborted canary, a TTL source it cannot read),
writes JSON lines only, and hands the Lease back when it is stopped."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from localkube.images import PAUSE_IMAGE
from localkube.processes import wait_for
from operator_process import condition, operator, rkd_status, tail_of
from spec_fragments import EXAMPLE_DIR

from kvrank.tools.processes import scrape
from kvrank_operator.crd import API_VERSION
from kvrank_operator.spec import namespace_for

pytestmark = pytest.mark.kube


def holder(cluster, namespace: str, lease: str) -> str:  # type: ignore[no-untyped-def]
    out = cluster.kubectl(
        "get",
        "lease",
        lease,
        "-n",
        namespace,
        "-o",
        "jsonpath={.spec.holderIdentity}",
        check=False,
    )
    return str(out.stdout) if out.returncode == 0 else ""


def ranker_deployment(ns: str) -> dict[str, Any]:
    """A canary rollout whose pods never serve (the pause image) and whose TTL source
    cannot be reached: what the operator decides does not need them."""
    return {
        "apiVersion": API_VERSION,
        "kind": "RankerDeployment",
        "metadata": {"name": "feed", "namespace": ns},
        "spec": {
            "model": {"version": "v1", "uri": "/models/v1", "image": PAUSE_IMAGE, "replicas": 1},
            "canary": {"version": "v2", "uri": "/models/v2", "weight": 50},
            "cache": {"redis": {"mode": "external", "url": "redis://nowhere.invalid:6379"}},
            "ttl": {
                "mode": "auto",
                "source": {"type": "prometheus", "prometheus": {"url": "http://127.0.0.1:9"}},
            },
        },
    }


def test_the_operator_leads_reconciles_counts_and_hands_its_lease_back(
    cluster, tmp_path: Path
) -> None:
    ns = f"op-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    with operator(cluster, ns, tmp_path) as op:
        metrics, log = op.metrics, op.log
        assert holder(cluster, ns, "kvrank-operator").startswith(os.uname().nodename)

        def status() -> dict[str, Any]:
            return rkd_status(cluster, ns)

        cluster.kubectl("apply", "-f", "-", input=json.dumps(ranker_deployment(ns)))
        wait_for(
            lambda: (
                {e["namespace"] for e in status().get("cacheNamespaces", [])}
                == {namespace_for("feed", ns, "v1"), namespace_for("feed", ns, "v2")}
            ),
            "both cache namespaces active",
            60,
            tail_of(log),
        )
        cluster.kubectl(
            "patch", "rkd", "feed", "-n", ns, "--type=json", "-p",
            '[{"op": "remove", "path": "/spec/canary"}]',
        )  # fmt: skip
        labels = {"rankerdeployment_namespace": ns, "rankerdeployment": "feed"}
        wait_for(
            lambda: (
                scrape(metrics, "kvrank_operator_events_total", reason="CanaryAborted", **labels)
                == 1
            ),
            "the aborted canary counted",
            60,
            tail_of(log),
        )
        ttl = next(c for c in status()["conditions"] if c["type"] == "TTLSource")
        assert (ttl["status"], ttl["reason"]) == ("False", "PrometheusUnreachable"), ttl
        assert scrape(metrics, "kvrank_operator_ttl_source_ok", **labels) == 0
        assert condition(status(), "Monitoring") is None  # no --pod-monitor
        cluster.kubectl("delete", "rkd", "feed", "-n", ns)  # while the operator runs
    lines = [json.loads(ln) for ln in log.read_text().splitlines() if ln.strip()]
    messages = [ln["message"] for ln in lines]
    assert any(m.startswith("leading as ") for m in messages), messages
    assert all({"message", "severity", "timestamp"} <= ln.keys() for ln in lines), lines[:3]
    assert holder(cluster, ns, "kvrank-operator") == ""  # handed back: no wait for expiry
    cluster.kubectl("delete", "namespace", ns, "--wait=false")


CRDS = Path(__file__).resolve().parents[2] / "e2e" / "localkube" / "prometheus-operator-crds.sh"


def test_pod_monitors_follow_the_crd_and_go_with_their_ranker_deployment(
    cluster, tmp_path: Path
) -> None:
    """Without the PodMonitor CRD the condition says so (and nothing else fails); once it is
    installed, the RankerDeployment gets its PodMonitor, which garbage collection removes
    with it."""
    ns = f"pm-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    crd = "podmonitors.monitoring.coreos.com"
    cluster.kubectl("delete", "crd", crd, "--ignore-not-found", "--wait")
    flags = ("--pod-monitor", "--pod-monitor-label=release=kps", "--pod-monitor-interval=15s")
    with operator(cluster, ns, tmp_path, *flags) as op:
        doc = ranker_deployment(ns)
        cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
        wait_for(
            lambda: (
                condition(rkd_status(cluster, ns), "Monitoring")
                == ("False", "PodMonitorCRDMissing")
            ),
            "Monitoring False for want of the CRD",
            60,
            tail_of(op.log),
        )
        status = rkd_status(cluster, ns)
        assert {e["namespace"] for e in status["cacheNamespaces"]} == {
            namespace_for("feed", ns, "v1"),
            namespace_for("feed", ns, "v2"),
        }

        crds = subprocess.run(["bash", str(CRDS)], capture_output=True, text=True, check=True)
        cluster.kubectl(
            "apply", "--server-side", "-f",
            str(Path(crds.stdout.strip()) / "monitoring.coreos.com_podmonitors.yaml"),
        )  # fmt: skip
        cluster.wait_established(crd)
        doc["spec"]["model"]["replicas"] = 2  # a spec change: the operator looks again at once
        cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
        wait_for(
            lambda: (
                condition(rkd_status(cluster, ns), "Monitoring") == ("True", "PodMonitorApplied")
            ),
            "Monitoring True",
            60,
            tail_of(op.log),
        )
        pm = json.loads(
            cluster.kubectl("get", "podmonitor", "feed-ranker", "-n", ns, "-o", "json").stdout
        )
        assert pm["metadata"]["labels"]["release"] == "kps"
        assert pm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == "feed"
        assert pm["spec"]["podMetricsEndpoints"][0]["interval"] == "15s"
        (owner,) = pm["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("RankerDeployment", "feed")
        cluster.kubectl("delete", "rkd", "feed", "-n", ns)
        wait_for(
            lambda: (
                cluster.kubectl("get", "podmonitor", "-n", ns, "-o", "name").stdout.strip() == ""
            ),
            "the PodMonitor garbage-collected",
            60,
            tail_of(op.log),
        )
    cluster.kubectl("delete", "namespace", ns, "--wait=false")


def _mismatches(want: Any, got: Any, path: str = "") -> list[str]:
    """Where ``got`` (a live object) differs from ``want`` (rendered): every rendered field
    must be there with its value; what the API server adds (defaults, status) is not asked."""
    from kubernetes.utils import parse_quantity

    if isinstance(want, dict) and isinstance(got, dict):
        return [m for k, v in want.items() for m in _mismatches(v, got.get(k), f"{path}.{k}")]
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        return [
            m
            for i, (w, g) in enumerate(zip(want, got, strict=True))
            for m in _mismatches(w, g, f"{path}[{i}]")
        ]
    if want == got:
        return []
    with contextlib.suppress(ValueError, TypeError):  # 0.5 and 500m are one quantity
        if parse_quantity(want) == parse_quantity(got):
            return []
    return [f"{path}: rendered {want!r}, applied {got!r}"]


def _live(cluster, ns: str, obj: dict[str, Any]) -> dict[str, Any] | None:  # type: ignore[no-untyped-def]
    group = obj["apiVersion"].rpartition("/")[0]
    kind = f"{obj['kind'].lower()}.{group}" if group else obj["kind"].lower()
    got = cluster.kubectl("get", f"{kind}/{obj['metadata']['name']}", "-n", ns,
                          "-o", "json", check=False)  # fmt: skip
    return json.loads(got.stdout) if got.returncode == 0 else None


def _differences(cluster, ns: str, rendered: list[dict[str, Any]]) -> list[str]:  # type: ignore[no-untyped-def]
    """Every rendered field the applied object lacks or holds otherwise (Secrets: only
    their keys, the values are generated in the cluster)."""
    problems: list[str] = []
    for obj in rendered:
        applied = _live(cluster, ns, obj)
        assert applied is not None
        if obj["kind"] == "Secret":
            keys = set(obj.get("stringData", {})) | set(obj.get("data", {}))
            obj = {k: v for k, v in obj.items() if k not in ("data", "stringData")}
            if not keys <= set(applied.get("data", {})):
                problems.append(f"Secret {obj['metadata']['name']}: keys {keys}")
        label = f"{obj['kind']} {obj['metadata']['name']}"
        problems += [f"{label}{m}" for m in _mismatches(obj, applied)]
    return problems


def test_render_prints_what_the_operator_applies(cluster, tmp_path: Path) -> None:
    """``kvrank-operator render`` of the examples against what the operator applied for them
    on a real API server: every rendered object exists with every rendered field (Secrets:
    their keys; their values are generated in the cluster)."""
    ns = f"render-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    cli = str(Path(sys.executable).parent / "kvrank-operator")
    rendered: list[dict[str, Any]] = []
    with operator(cluster, ns, tmp_path) as op:
        try:
            for example in ("basic.yaml", "canary.yaml"):
                doc = yaml.safe_load((EXAMPLE_DIR / example).read_text())
                doc["metadata"]["name"] = example.removesuffix(".yaml")
                text = yaml.safe_dump(doc)
                out = subprocess.run([cli, "render", "-f", "-", "--namespace", ns], input=text,
                                     capture_output=True, text=True, check=True)  # fmt: skip
                rendered += list(yaml.safe_load_all(out.stdout))
                cluster.kubectl("apply", "-n", ns, "-f", "-", input=text)
            wait_for(
                lambda: all(_live(cluster, ns, o) for o in rendered),
                "every rendered object applied",
                90,
                tail_of(op.log),
            )  # fmt: skip
            problems = _differences(cluster, ns, rendered)
        finally:
            # while the operator runs: it takes its finalizers off (left on, they would keep
            # the namespace, and later the CRD, from ever being deleted)
            cluster.kubectl("delete", "rkd", "--all", "-n", ns, "--timeout=120s")
    assert not problems, "\n".join(problems[:20])
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
