"""The Helm chart: lint-clean, renders least-privilege RBAC, and ships the CRD generated
from the operator's single source of truth."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from helm_chart import CHART, KUBE_VERSION, MONITORING, SERVED, helm, render

from kvrank_common import PROBE_TIMEOUT_S
from kvrank_operator.crd import crd


def test_the_install_the_readme_shows_names_its_objects_kvrank_operator() -> None:
    """``helm install kvrank-operator …`` (the README's): ``kvrank-operator``, not
    ``kvrank-operator-kvrank-operator``; any other release name prefixes it."""
    readme = (CHART / "README.md").read_text()
    assert "helm install kvrank-operator charts/kvrank-operator" in readme
    names = {"kvrank-operator": "kvrank-operator", "team-a": "team-a-kvrank-operator"}
    for release, name in names.items():
        (dep,) = [d for d in render(release=release) if d["kind"] == "Deployment"]
        assert dep["metadata"]["name"] == name


def test_crd_file_is_generated_from_the_source_of_truth() -> None:
    assert yaml.safe_load((CHART / "crds" / "rankerdeployments.yaml").read_text()) == crd()


@pytest.mark.parametrize("values", sorted(p.name for p in (CHART / "ci").glob("*.yaml")))
def test_lint_is_clean(values: str) -> None:
    out = helm(
        "lint",
        str(CHART),
        "--strict",
        "--kube-version",
        KUBE_VERSION,
        "-f",
        str(CHART / "ci" / values),
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_schema_rejects_unknown_values() -> None:
    out = helm("template", "rel", str(CHART), "--kube-version", KUBE_VERSION, "--set", "surprise=1")
    assert out.returncode != 0 and "surprise" in out.stderr


Rules = dict[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], set[str]]
CRD_RULES: Rules = {
    (("apiextensions.k8s.io",), ("customresourcedefinitions",), ()): {"get", "list", "watch"},
    # its own CRD only, and no create: the chart installs it first
    (("apiextensions.k8s.io",), ("customresourcedefinitions",), ("rankerdeployments.kvrank.io",)): {
        "patch"
    },
}


def _rules(doc: dict) -> Rules:
    return {
        (tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r.get("resourceNames", ()))): set(
            r["verbs"]
        )
        for r in doc["rules"]
    }


def test_rbac_is_least_privilege() -> None:
    role = next(d for d in render() if d["kind"] == "ClusterRole")
    rules = _rules(role)
    assert rules[(("kvrank.io",), ("rankerdeployments",), ())] == {"get", "list", "watch", "patch"}
    assert rules[(("",), ("pods",), ())] == {"list", "watch"}
    assert rules[(("",), ("secrets",), ())] == {"get", "create", "patch"}  # never list or watch
    # delete: the bundled router's ConfigMap and PDB, when routing goes back to none
    assert rules[(("",), ("configmaps",), ())] == {"create", "patch", "delete"}
    assert CRD_RULES.items() <= rules.items()
    assert not [k for k in rules if k[0] == ("gateway.networking.k8s.io",)]  # opt-in
    everything = {v for verbs in rules.values() for v in verbs}
    assert "*" not in everything and "escalate" not in everything and "bind" not in everything
    assert all("*" not in r["resources"] for r in role["rules"])


def test_gateway_routing_may_write_routes_and_policies_only() -> None:
    role = next(
        d for d in render("--set", "rbac.gatewayRouting=true") if d["kind"] == "ClusterRole"
    )
    rules = _rules(role)
    assert rules[(("gateway.networking.k8s.io",), ("httproutes",), ())] == {
        "get",
        "create",
        "patch",
        "delete",
    }
    assert rules[(("gateway.envoyproxy.io",), ("backendtrafficpolicies",), ())] == {
        "create",
        "patch",
        "delete",
    }
    gateway_groups = {"gateway.networking.k8s.io", "gateway.envoyproxy.io"}
    assert len([k for k in rules if set(k[0]) & gateway_groups]) == 2  # no Gateways, no list


def test_watched_namespaces_get_roles_not_cluster_wide_rights() -> None:
    docs = render("-f", str(CHART / "ci" / "namespaced-values.yaml"))
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert _rules(cluster_role) == CRD_RULES
    own = [d for d in docs if d["kind"] in ("Role", "RoleBinding")]
    watched = [d for d in own if not d["metadata"]["name"].endswith("-self")]
    roles = {d["metadata"]["namespace"]: d for d in watched if d["kind"] == "Role"}
    bindings = {d["metadata"]["namespace"]: d for d in watched if d["kind"] == "RoleBinding"}
    assert set(roles) == set(bindings) == {"ranking", "ranking-canary"}
    cluster_wide = _rules(next(d for d in render() if d["kind"] == "ClusterRole"))
    for ns, role in roles.items():
        assert _rules(role) == {
            k: v
            for k, v in cluster_wide.items()
            if k[1] not in (("customresourcedefinitions",), ("namespaces",))
        }, ns
        (subject,) = bindings[ns]["subjects"]
        assert subject["namespace"] == "kvrank-system" and bindings[ns]["roleRef"]["kind"] == "Role"


def test_the_uninstall_hook_may_stop_only_its_own_operator() -> None:
    docs = render()
    (hook,) = [d for d in docs if d["kind"] == "Job"]
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    args = hook["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["release-finalizers", "--operator=kvrank-system/rel-kvrank-operator"]
    operator = next(d for d in docs if d["kind"] == "Deployment")
    selector = operator["spec"]["selector"]["matchLabels"].items()
    # the hook waits for the operator's pods to go: its own pod must not be one of them
    assert not selector <= hook["spec"]["template"]["metadata"]["labels"].items()
    # nor may the helm test pod (kept after `helm test`) look like one: the operator's
    # ReplicaSet would adopt it, and the hook would wait for it forever
    test_pod = next(d for d in docs if d["kind"] == "Pod" and "test" in d["metadata"]["name"])
    assert not selector <= test_pod["metadata"]["labels"].items()
    (own,) = [d for d in docs if d["kind"] == "Role"]
    rules = _rules(own)
    assert rules[(("apps",), ("deployments",), ("rel-kvrank-operator",))] == {"get", "patch"}
    assert own["metadata"]["namespace"] == "kvrank-system"


def test_operator_pod_is_non_root_and_uses_its_service_account() -> None:
    docs = render("-f", str(CHART / "ci" / "namespaced-values.yaml"))
    dep = next(d for d in docs if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["serviceAccountName"] == "kvrank-operator-sa"
    assert "--namespace=ranking" in pod["containers"][0]["args"]
    assert "helm.sh/chart" not in dep["spec"]["selector"]["matchLabels"]


def test_prometheus_credentials_are_mounted_read_only_when_a_secret_is_named() -> None:
    def operator_pod(*args: str) -> dict:
        docs = render(*args)
        return next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]

    plain = operator_pod()
    assert "prometheus-auth" not in {v["name"] for v in plain["volumes"]}
    pod = operator_pod("--set", "prometheusAuth.secretName=thanos-reader")
    volume = next(v for v in pod["volumes"] if v["name"] == "prometheus-auth")
    assert volume["secret"]["secretName"] == "thanos-reader"
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "prometheus-auth"]
    assert mount == {
        "name": "prometheus-auth",
        "mountPath": "/var/run/secrets/kvrank/prometheus",
        "readOnly": True,
    }


def test_the_operator_pods_are_ready_on_their_metrics_and_reachable_only_by_scrapers() -> None:
    docs = render("--set", "test.rankerDeployment.name=feed")
    dep = next(d for d in docs if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    # readiness is what its Service carries (the metrics), liveness kopf's health
    assert container["readinessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"]["port"] == "health"
    for probe in ("readinessProbe", "livenessProbe"):  # a loaded node answers late, not never
        assert container[probe]["timeoutSeconds"] >= PROBE_TIMEOUT_S, probe
    assert (
        pod["securityContext"]["runAsUser"] > 10000 and pod["securityContext"]["runAsGroup"] > 10000
    )
    for part in ("requests", "limits"):
        assert {"memory", "ephemeral-storage"} <= container["resources"][part].keys(), part
    (pdb,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "NetworkPolicy"}
    operator = policies["rel-kvrank-operator"]["spec"]
    assert operator["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    scrapers, tests = operator["ingress"]
    assert scrapers["from"][0]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "prometheus"
    }
    assert scrapers["ports"] == [{"port": "metrics"}]
    # the release's `helm test` pod is admitted to both ports it checks, and nothing else is
    test_pod = next(d for d in docs if d["kind"] == "Pod")
    assert (
        tests["from"][0]["podSelector"]["matchLabels"].items()
        <= test_pod["metadata"]["labels"].items()
    )
    assert {p["port"] for p in tests["ports"]} == {"metrics", "health"}
    hooks = policies["rel-kvrank-operator-hooks"]["spec"]
    assert (
        "ingress" not in hooks and "test" in hooks["podSelector"]["matchExpressions"][0]["values"]
    )
    off = render(
        "--set", "networkPolicy.enabled=false", "--set", "podDisruptionBudget.enabled=false"
    )
    assert not {"NetworkPolicy", "PodDisruptionBudget"} & {d["kind"] for d in off}


def test_by_default_two_replicas_elect_one_leader_on_their_own_lease() -> None:
    docs = render()
    dep = next(d for d in docs if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2
    assert "--lease=rel-kvrank-operator" in pod["containers"][0]["args"]
    assert dep["spec"]["strategy"] == {"type": "Recreate"}  # old and new never overlap
    spread = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert spread[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    (own,) = [d for d in docs if d["kind"] == "Role"]
    rules = _rules(own)
    assert rules[(("coordination.k8s.io",), ("leases",), ("rel-kvrank-operator",))] == {
        "get",
        "update",
    }
    assert rules[(("coordination.k8s.io",), ("leases",), ())] == {"create"}


def test_without_leader_election_one_replica_runs_and_more_are_refused() -> None:
    docs = render("--set", "leaderElection.enabled=false", "--set", "replicaCount=1")
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert not any(
        a.startswith("--lease") for a in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    (own,) = [d for d in docs if d["kind"] == "Role"]
    assert not any(k[1] == ("leases",) for k in _rules(own))
    out = helm(
        "template",
        "rel",
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "leaderElection.enabled=false",
        "--set",
        "replicaCount=2",
    )
    assert out.returncode != 0 and "leaderElection.enabled" in out.stderr


MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def dashboard_config_map(docs: list[dict]) -> dict:
    return next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("dashboard")
    )


def operator_args(docs: list[dict]) -> list[str]:
    dep = next(d for d in docs if d["kind"] == "Deployment")
    return list(dep["spec"]["template"]["spec"]["containers"][0]["args"])


def test_monitoring_objects_are_off_by_default() -> None:
    docs = render()
    assert not {d["kind"] for d in docs} & MONITORING_KINDS
    assert not [d for d in docs if d["kind"] == "ConfigMap"]
    assert not [a for a in operator_args(docs) if a.startswith("--pod-monitor")]
    rules = _rules(next(d for d in docs if d["kind"] == "ClusterRole"))
    assert not [k for k in rules if k[0] == ("monitoring.coreos.com",)]


def test_a_cluster_without_prometheus_operator_gets_no_monitor_or_rule_but_the_dashboard() -> None:
    """Enabled before prometheus-operator is installed, the chart still installs: the
    objects of kinds the cluster does not serve are left out (NOTES.txt warns)."""
    kinds = {d["kind"] for d in render(*MONITORING[len(SERVED) :])}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    assert "ConfigMap" in kinds
    assert {"ServiceMonitor", "PrometheusRule"} <= {d["kind"] for d in render(*MONITORING)}


def test_monitoring_objects_scrape_operator_and_rankers_and_the_rules_pass_promtool(
    tmp_path: Path,
) -> None:
    docs = render(*MONITORING, "--set", "monitoring.labels.release=kps")
    by_kind = {d["kind"]: d for d in docs}
    assert "PodMonitor" not in by_kind  # the operator makes one per RankerDeployment
    monitor = by_kind["ServiceMonitor"]["spec"]
    operator_service = by_kind["Service"]
    assert (
        monitor["selector"]["matchLabels"].items() <= operator_service["metadata"]["labels"].items()
    )
    assert monitor["endpoints"][0]["port"] == "metrics"
    assert by_kind["ServiceMonitor"]["metadata"]["labels"]["release"] == "kps"
    # the operator puts a PodMonitor (with the same labels) next to every RankerDeployment,
    # and may: create and patch PodMonitors, nothing else of prometheus-operator's
    args = operator_args(docs)
    assert {
        "--pod-monitor",
        "--pod-monitor-interval=30s",
        "--pod-monitor-label=release=kps",
    } <= set(args)
    rules = _rules(by_kind["ClusterRole"])
    assert rules[(("monitoring.coreos.com",), ("podmonitors",), ())] == {"create", "patch"}
    assert [k for k in rules if k[0] == ("monitoring.coreos.com",)] == [
        (("monitoring.coreos.com",), ("podmonitors",), ())
    ]
    rule_file = tmp_path / "rules.yaml"
    rule_file.write_text(yaml.safe_dump(by_kind["PrometheusRule"]["spec"]))
    check = subprocess.run(
        ["promtool", "check", "rules", str(rule_file)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    groups = by_kind["PrometheusRule"]["spec"]["groups"]
    alerts = {r["alert"] for g in groups for r in g["rules"]}
    assert {"KvrankCacheHitRatioLow", "KvrankRedisBreakerOpen", "KvrankOperatorNoLeader"} <= alerts
    hit_ratio = next(
        r for g in groups for r in g["rules"] if r["alert"] == "KvrankCacheHitRatioLow"
    )
    assert "< 0.7" in hit_ratio["expr"] and hit_ratio["for"] == "10m"  # the brief's alarm


def test_with_watched_namespaces_only_those_may_get_pod_monitors() -> None:
    docs = render("-f", str(CHART / "ci" / "namespaced-values.yaml"), *MONITORING)
    cluster_role = _rules(next(d for d in docs if d["kind"] == "ClusterRole"))
    assert not [k for k in cluster_role if k[0] == ("monitoring.coreos.com",)]
    roles = [d for d in docs if d["kind"] == "Role" and not d["metadata"]["name"].endswith("-self")]
    assert {r["metadata"]["namespace"] for r in roles} == {"ranking", "ranking-canary"}
    for role in roles:
        assert _rules(role)[(("monitoring.coreos.com",), ("podmonitors",), ())] == {
            "create",
            "patch",
        }


def dashboard_check(path: Path) -> subprocess.CompletedProcess[str]:
    script = CHART.parents[1] / "scripts" / "dashboard-check.sh"
    binary = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, check=True
    ).stdout.strip()
    return subprocess.run([binary, str(path)], capture_output=True, text=True, timeout=60)


def test_the_dashboard_is_a_valid_grafana_dashboard_for_the_sidecar(tmp_path: Path) -> None:
    """Strictly decoded against Grafana's dashboard schema (grafana-foundation-sdk): every
    panel's options and query included; a misspelled field fails the check."""
    cm = dashboard_config_map(
        render(*MONITORING, "--set", "monitoring.dashboard.annotations.grafana_folder=kvrank")
    )
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"  # the sidecar's default
    assert cm["metadata"]["namespace"] == "kvrank-system"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "kvrank"}
    (name, text) = next(iter(cm["data"].items()))
    dashboard = json.loads(text)
    path = tmp_path / name
    path.write_text(text)
    check = dashboard_check(path)
    assert check.returncode == 0, check.stderr
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    titles = {p["title"] for p in panels}
    assert {"Hit ratio", "Latency by cache outcome", "TTL in force", "Redis breaker open"} <= titles
    assert all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in panels)

    panels[0]["targets"][0]["exp"] = panels[0]["targets"][0].pop("expr")
    path.write_text(json.dumps(dashboard))
    check = dashboard_check(path)
    assert check.returncode == 1 and "unexpected field 'exp'" in check.stderr, check.stderr


def test_the_dashboard_may_go_where_grafana_looks() -> None:
    cm = dashboard_config_map(
        render(*MONITORING, "--set", "monitoring.dashboard.namespace=grafana")
    )
    assert cm["metadata"]["namespace"] == "grafana"


def test_the_chart_readme_lists_every_value_as_values_yaml_describes_it(tmp_path: Path) -> None:
    """The README's parameter tables are what the readme generator renders from values.yaml
    (run `make chart-readme` after adding or changing a value)."""
    root = CHART.parents[1]
    out = subprocess.run(["bash", str(root / "scripts" / "build-readme-generator.sh")],
                         capture_output=True, text=True, check=True)  # fmt: skip
    generator = Path(out.stdout.strip().splitlines()[-1]) / "readme-generator"
    readme = tmp_path / "README.md"
    readme.write_text((CHART / "README.md").read_text())
    run = subprocess.run(
        [str(generator), "-v", str(CHART / "values.yaml"), "-r", str(readme)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr  # a value without its @param fails here
    assert readme.read_text() == (CHART / "README.md").read_text(), "run make chart-readme"


def test_names_and_namespace_can_be_overridden_and_redis_still_admits_the_operator() -> None:
    from kvrank_operator.manifests.redis import OPERATOR_POD_LABEL, managed_redis
    from kvrank_operator.spec import Defaults, parse_spec

    docs = render("--set", "fullnameOverride=ranking-op", "--set", "namespaceOverride=ops",
                  "--set", "nameOverride=rkop")  # fmt: skip
    namespaced = [d for d in docs if d["kind"] not in ("ClusterRole", "ClusterRoleBinding")]
    assert {d["metadata"].get("namespace") for d in namespaced} == {"ops"}
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert dep["metadata"]["name"] == "ranking-op"
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "rkop"
    # a managed Redis admits the operator by a label no override changes, from the namespace
    # the chart runs it in (POD_NAMESPACE: the operator's --operator-namespace) only
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    defaults = Defaults(operator_namespace="ops")
    spec = parse_spec({"model": {"version": "v1", "uri": "/models/v1"}}, defaults)
    policy = next(
        o for o in managed_redis(spec, "f", "p", ("x", "y")) if o["kind"] == "NetworkPolicy"
    )
    peers = policy["spec"]["ingress"][0]["from"]
    operator = {"matchLabels": {OPERATOR_POD_LABEL: "true"}}
    ops = {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}
    assert {"namespaceSelector": ops, "podSelector": operator} in peers
    assert not any(p.get("namespaceSelector") == {} for p in peers), "any namespace admitted"
    assert labels[OPERATOR_POD_LABEL] == "true"
    binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
    assert binding["subjects"][0]["namespace"] == "ops"


def test_every_alert_links_to_its_section_of_the_troubleshooting_page() -> None:
    """An on-call engineer's first click: each alert's runbook_url lands on a heading that
    says what it means and what to do."""
    docs = render(*MONITORING)
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    page = (CHART.parents[1] / "docs" / "troubleshooting.md").read_text()
    # GitHub's anchors: a heading's text, lower case
    anchors = {line[4:].strip().lower() for line in page.splitlines() if line.startswith("### ")}
    base = "https://github.com/kvrank/kvrank/blob/main/docs/troubleshooting.md#"
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert alerts
    for alert in alerts:
        url = alert["annotations"]["runbook_url"]
        assert url == base + alert["alert"].lower(), url
        assert alert["alert"].lower() in anchors, f"no section for {alert['alert']}"
    own = render(
        *MONITORING, "--set", "monitoring.rules.runbookBaseUrl=https://wiki.example/kvrank"
    )
    rule = next(d for d in own if d["kind"] == "PrometheusRule")
    url = rule["spec"]["groups"][0]["rules"][0]["annotations"]["runbook_url"]
    assert url.startswith("https://wiki.example/kvrank#")


def test_the_default_images_reach_the_operator_pinned_by_digest_when_given() -> None:
    digest = "sha256:" + "ab" * 32
    args = operator_args(render())
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert f"--ranker-image=ghcr.io/kvrank/ranker:{version}" in args
    assert "--redis-image=redis:7.2" in args
    assert f"--router-image=ghcr.io/kvrank/router:{version}" in args
    docs = render(
        "--set", "defaultImages.ranker.repository=registry.local/kvrank/ranker",
        "--set", f"defaultImages.ranker.digest={digest}",
        "--set", f"image.digest={digest}",
    )  # fmt: skip
    assert f"--ranker-image=registry.local/kvrank/ranker:{version}@{digest}" in operator_args(docs)
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"].endswith(f"@{digest}")
    out = helm("template", "rel", str(CHART), "--set", "defaultImages.redis.digest=latest")
    assert out.returncode != 0 and "defaultImages/redis/digest" in out.stderr


@pytest.mark.parametrize(
    ("args", "platform"),
    [
        ((), False),
        (("--api-versions", "security.openshift.io/v1"), True),  # auto on OpenShift
        (("--set", "podIds=platform"), True),
        (("--set", "podIds=fixed", "--api-versions", "security.openshift.io/v1"), False),
    ],
    ids=["plain cluster", "OpenShift", "platform", "fixed on OpenShift"],
)
def test_on_openshift_no_pod_fixes_its_uid_and_the_operator_is_told_so(
    args: tuple[str, ...], platform: bool
) -> None:
    docs = render("--set", "monitoring.podMonitor.enabled=false", *args)
    pods = {
        f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["spec"]
        if "template" in d["spec"]
        else d["spec"]
        for d in docs
        if d["kind"] in ("Deployment", "Job", "Pod")
    }
    assert {k.split("/")[0] for k in pods} == {"Deployment", "Job", "Pod"}  # hook, helm test
    for name, pod in pods.items():
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True, name
        assert ("runAsUser" in security) is not platform, f"{name}: {security}"
    assert ("--platform-ids" in operator_args(docs)) is platform
    out = helm("template", "rel", str(CHART), "--set", "podIds=openshift")
    assert out.returncode != 0 and "podIds" in out.stderr
