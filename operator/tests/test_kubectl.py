"""``kubectl rkd status`` as a person reads it: one row per version, the rollout with its
step and checks, each cache namespace, the TTL and the conditions. (The commands that change
a RankerDeployment: against the session's API server here, and driving a canary on real pods
in ``e2e/test_canary.py``.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from api_server import install_crds
from rich.console import Console
from typer.testing import CliRunner

from kvrank_operator.crd import API_VERSION
from kvrank_operator.kubectl import app, describe

OBJ: dict[str, Any] = {
    "metadata": {"name": "feed-ranker", "namespace": "ranking"},
    "spec": {"model": {"version": "v1"}, "canary": {"version": "v2", "paused": True}},
    "status": {
        "url": "http://feed-ranker.ranking.svc:8080",
        "readyText": "5/5",
        "versions": [
            {"version": "v1", "role": "stable", "replicas": 4, "readyReplicas": 4},
            {"version": "v2", "role": "canary", "replicas": 1, "readyReplicas": 1},
        ],
        "canary": {
            "version": "v2",
            "phase": "Progressing",
            "since": "2026-12-03T10:00:00Z",
            "step": 1,
            "stepText": "1/2",
            "weight": 20,
            "message": "step 1/2 at 20%: paused (checks pass)",
            "checks": [
                {
                    "metric": "scoreDelta",
                    "value": 0.0031,
                    "max": 0.01,
                    "samples": 80,
                    "minSamples": 50,
                    "result": "pass",
                },
                {
                    "metric": "rankCorrelation",
                    "value": None,
                    "min": 0.95,
                    "samples": 3,
                    "minSamples": 50,
                    "result": "inconclusive",
                },
            ],
        },
        "cacheNamespaces": [
            {"version": "v1", "namespace": "kv1", "role": "stable", "state": "active"},
            {
                "version": "v0",
                "namespace": "kv0",
                "state": "retired",
                "purgeAfter": "2026-12-03T10:05:00Z",
            },
        ],
        "ttl": {"seconds": 120.0, "meanIntervalSeconds": 41.5, "source": "pods"},
        "hitRatio": 0.8312,
        "observedAt": "2026-12-03T10:01:00Z",
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Ready", "message": "5/5"},
            # a long message (the pods' last log line) must not squeeze the table's rows
            {
                "type": "RankersStarted",
                "status": "False",
                "reason": "StartFailed",
                "message": "v2: " + "model artifact s3://models/feed/v2 does not match " * 8,
            },
        ],
    },
}


def rows(obj: dict[str, Any]) -> list[list[str]]:
    console = Console(width=200, record=True, soft_wrap=True)
    with console.capture() as out:
        console.print(describe(obj))
    return [line.split() for line in out.get().splitlines()]


def test_status_shows_versions_rollout_checks_namespaces_ttl_and_conditions() -> None:
    got = rows(OBJ)
    assert ["URL", "http://feed-ranker.ranking.svc:8080"] in got
    assert ["Version", "v1", "stable", "4/4", "ready"] in got
    assert ["Version", "v2", "canary", "1/1", "ready", "20%"] in got
    rollout = next(r for r in got if r[0] == "Rollout")
    assert rollout[:5] == ["Rollout", "v2", "Progressing", "paused", "1/2"], rollout
    assert ["Check", "scoreDelta", "0.0031", "max", "0.01", "80/50", "samples", "pass"] in got
    waiting = ["Check", "rankCorrelation", "-", "min", "0.95", "3/50", "samples", "inconclusive"]
    assert waiting in got
    assert ["Cache", "kv1", "v1", "stable", "active"] in got
    assert ["Cache", "kv0", "v0", "retired", "purge", "after", "2026-12-03T10:05:00Z"] in got
    assert ["TTL", "120s", "pods", "mean", "interval", "41.5s"] in got
    assert ["Hit", "ratio", "0.831", "at", "2026-12-03T10:01:00Z"] in got
    assert ["Condition", "Ready", "True", "Ready:", "5/5"] in got
    assert ["Rollout:", "step", "1/2", "at", "20%:", "paused", "(checks", "pass)"] in got


def test_a_new_object_without_status_still_prints() -> None:
    got = rows({"metadata": {"name": "fresh", "namespace": "ranking"}, "spec": {}})
    assert ["Name", "fresh", "(ranking)"] in got and ["Ready", "-"] in got


def test_every_command_is_there_with_help() -> None:
    out = CliRunner().invoke(app, ["--help"]).output
    for command in ("list", "status", "watch", "promote", "abort", "pause", "resume"):
        assert command in out, out


def test_no_kubeconfig_or_no_api_server_is_one_line_naming_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Not a traceback: what is missing, and where the plugin looked."""
    gone = CliRunner().invoke(app, ["status", "x"], env={"KUBECONFIG": str(tmp_path / "none")})
    assert gone.exit_code == 1 and "no usable kubeconfig" in gone.output, gone.output
    assert "Traceback" not in gone.output
    config = tmp_path / "config"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u, namespace: ranking}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    down = CliRunner().invoke(app, ["list", "--kubeconfig", str(config)])
    assert down.exit_code == 1, down.output
    assert "cannot reach the API server at http://127.0.0.1:9" in down.output, down.output
    assert len(down.output.strip().splitlines()) == 1


STEPPED: dict[str, Any] = {
    "model": {"version": "v1", "uri": "/models/v1", "sha256": "a" * 64},
    "canary": {
        "version": "v2",
        "uri": "/models/v2",
        "image": "ranker:v2-code",
        "steps": [{"weight": 20}, {"weight": 50}],
        "analysis": {"errorRatio": {"max": 0.01}},
    },
}


@pytest.mark.kube
def test_the_commands_change_the_spec_through_kubectl_on_a_real_api_server(cluster) -> None:  # type: ignore[no-untyped-def]
    """``kubectl rkd …`` as a user runs it (kubectl finds the plugin on PATH), against the
    API server with the CRD: what each command writes, and what it refuses."""
    install_crds(cluster, [], [], ours=True)
    ns = "default"

    def rkd(*args: str) -> subprocess.CompletedProcess[str]:
        venv = Path(sys.executable).parent
        return cluster.kubectl_plugin("rkd", *args, "-n", ns, path=venv, check=False)

    def spec(name: str) -> dict[str, Any]:
        got = cluster.kubectl("get", "rkd", name, "-n", ns, "-o", "json").stdout
        return dict(json.loads(got)["spec"])

    def create(name: str, body: dict[str, Any]) -> None:
        doc = {"apiVersion": API_VERSION, "kind": "RankerDeployment", "metadata": {"name": name}}
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps({**doc, "spec": body}))

    def write_status(name: str, status: dict[str, Any]) -> None:
        patch = json.dumps({"status": status})
        cluster.kubectl(
            "patch", "rkd", name, "-n", ns, "--subresource=status", "--type=merge", "-p", patch
        )

    create("plugin-stepped", STEPPED)
    try:
        assert rkd("pause", "plugin-stepped").returncode == 0
        assert spec("plugin-stepped")["canary"]["paused"] is True
        assert rkd("resume", "plugin-stepped").returncode == 0
        assert spec("plugin-stepped")["canary"]["paused"] is False
        shown = rkd("status", "plugin-stepped")
        assert shown.returncode == 0 and "plugin-stepped (default)" in shown.stdout, shown
        # promote: one step on from the step the status shows, however often it is run
        at = {"version": "v2", "phase": "Progressing", "step": 1, "since": "2026-01-01T00:00:00Z"}
        write_status("plugin-stepped", {"canary": at})
        for _ in range(2):
            moved = rkd("promote", "plugin-stepped")
            assert "canary v2 step 1/2 → step 2" in moved.stdout, moved
            assert spec("plugin-stepped")["canary"]["skipToStep"] == 2
        version_change = json.dumps({"spec": {"canary": {"version": "v3"}}})
        kept = cluster.kubectl(
            "patch",
            "rkd",
            "plugin-stepped",
            "-n",
            ns,
            "--type=merge",
            "-p",
            version_change,
            check=False,
        )
        assert kept.returncode != 0 and "remove it when canary.version changes" in kept.stderr
        write_status("plugin-stepped", {"canary": {**at, "step": 2}})
        last = rkd("promote", "plugin-stepped")
        assert "step 2/2 → promoted after its last step" in last.stdout, last
        assert spec("plugin-stepped")["canary"]["skipToStep"] == 3
        done = rkd("promote", "plugin-stepped", "--full")
        assert "promoted canary v2 (was v1)" in done.stdout, done
        model = spec("plugin-stepped")["model"]
        assert "canary" not in spec("plugin-stepped")
        assert (model["version"], model["uri"], model["image"]) == (
            "v2",
            "/models/v2",
            "ranker:v2-code",
        )
        assert "sha256" not in model, "the old version's digest must not pin the new weights"
        for verb in ("promote", "abort", "pause"):
            refused = rkd(verb, "plugin-stepped")
            assert refused.returncode == 1, refused
            assert f"plugin-stepped has no canary to {verb}" in refused.stderr, refused
        manual = {
            **STEPPED,
            "canary": {"version": "v2", "uri": "/models/v2", "promotion": "status"},
        }
        create("plugin-gitops", manual)
        for verb in ("promote", "abort"):
            refused = rkd(verb, "plugin-gitops")
            assert refused.returncode == 1 and "GitOps" in refused.stderr, refused
            assert spec("plugin-gitops")["canary"]["version"] == "v2", "nothing written"
        no_steps = rkd("pause", "plugin-gitops")
        assert no_steps.returncode == 1 and "has no steps" in no_steps.stderr, no_steps
        assert rkd("abort", "plugin-gitops", "--force").returncode == 0
        assert "canary" not in spec("plugin-gitops")
        listed = rkd("list").stdout
        assert "plugin-gitops" in listed and "plugin-stepped" in listed, listed
        as_json = json.loads(rkd("status", "plugin-gitops", "-o", "json").stdout)
        assert as_json["metadata"]["name"] == "plugin-gitops"
        # --wait: a CI step's gate, on the status the operator writes (patched here)
        waited = rkd("status", "plugin-stepped", "--wait", "--timeout", "1")
        assert waited.returncode == 2 and "not over after 1s" in waited.stderr, waited
        ready = {"type": "Ready", "status": "True", "reason": "Serving", "message": "ok"}
        url = "http://plugin-stepped.default.svc.cluster.local:8080"
        write_status("plugin-stepped", {"conditions": [ready], "url": url, "readyText": "2/2"})
        assert rkd("status", "plugin-stepped", "--wait").returncode == 0
        # kubectl get rkd: the Ready condition and the URL, as kubectl get isvc shows them
        table = cluster.kubectl("get", "rkd", "plugin-stepped", "-n", ns).stdout.splitlines()
        row = dict(zip(table[0].split(), table[1].split(), strict=False))
        assert (row["READY"], row["PODS"], row["URL"]) == ("True", "2/2", url), table
        create("plugin-failing", STEPPED)
        aborted = {"version": "v2", "phase": "Aborted", "message": "errorRatio failed"}
        write_status("plugin-failing", {"canary": aborted, "conditions": [ready]})
        failed = rkd("status", "plugin-failing", "--wait")
        assert failed.returncode == 1 and "errorRatio failed" in failed.stdout, failed
        missing = rkd("status", "plugin-nowhere")
        assert missing.returncode == 1
        assert "rankerdeployment plugin-nowhere not found in namespace default" in missing.stderr
    finally:
        names = ("plugin-stepped", "plugin-gitops", "plugin-failing")
        cluster.kubectl("delete", "rkd", *names, "-n", ns, check=False)
