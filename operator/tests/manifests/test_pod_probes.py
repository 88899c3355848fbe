"""The probes of every container the operator runs: a loaded node answers them late, and a
late answer must not restart a healthy process or pull it out of routing."""

from __future__ import annotations

from typing import Any

from spec_fragments import example

from kvrank_common import PROBE_TIMEOUT_S
from kvrank_operator import manifests as m
from kvrank_operator.spec import parse_spec


def _containers() -> list[tuple[str, dict[str, Any]]]:
    """``(pod owner, container)`` for the rankers (behind a queue proxy), Redis, the routers."""
    doc = {**example("canary.yaml"), "routing": {"mode": "bundled"}}
    doc["admission"] = {"queueProxy": {"enabled": True}}
    spec = parse_spec(doc)
    objs = [d.obj for d in m.desired_rankers(spec, "feed", "prod", 60.0, "k" * 43)]
    objs += [d.obj for d in m.desired_redis(spec, "feed", "prod", ("s3cret", "r4nker"))]
    objs += m.router_objects(spec, "feed", "prod", frozenset({"v1"}))
    return [
        (o["metadata"]["name"], c)
        for o in objs
        if o["kind"] in ("Deployment", "StatefulSet")
        for c in o["spec"]["template"]["spec"]["containers"]
    ]


def test_every_probe_waits_seconds_for_its_answer_and_liveness_longest() -> None:
    seen = set()
    for owner, c in _containers():
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            if probe := c.get(kind):
                seen.add(kind)
                where = f"{owner}/{c['name']} {kind}"
                # the kubelet's default is one second
                assert probe.get("timeoutSeconds", 1) >= 2, where
                # a restart costs a ranker its L1: only a process silent for seconds is hung
                if kind != "readinessProbe":
                    assert probe["timeoutSeconds"] >= PROBE_TIMEOUT_S >= 5, where
    assert seen == {"readinessProbe", "livenessProbe", "startupProbe"}
