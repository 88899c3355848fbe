"""Spec fragments several operator test modules apply or build from, and the readers they
share: the repository's example specs, a workload's first container."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples"
TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "docs" / "templates"
SPEC_FILES = sorted(EXAMPLE_DIR.glob("*.yaml")) + sorted(TEMPLATE_DIR.glob("*.yaml"))
"""Every RankerDeployment the repository ships: the examples (they run as written) and the
templates (a bucket's or a Redis Cluster's details of the user's to fill in)."""

SECRET_REF = {"name": "s", "key": "k"}
POD_KNOBS = {
    "imagePullSecrets": [{"name": "registry-creds"}],
    "serviceAccountName": "ranker-sa",
    "labels": {"team": "feed", "cost-center": "ads"},
    "annotations": {"policy.example.com/profile": "gpu"},
    "priorityClassName": "serving-high",
    "runtimeClassName": "nvidia",
    "securityContext": {"runAsUser": 20001, "runAsGroup": 20002, "fsGroup": 20003},
    "startupProbe": {"periodSeconds": 10, "failureThreshold": 90},
}


def example(name: str) -> dict[str, Any]:
    """The ``spec`` of ``examples/<name>`` (or ``docs/templates/<name>``), as a user would
    apply it."""
    path = EXAMPLE_DIR / name if (EXAMPLE_DIR / name).exists() else TEMPLATE_DIR / name
    spec: dict[str, Any] = yaml.safe_load(path.read_text())["spec"]
    return spec


def first_container(obj: dict[str, Any]) -> dict[str, Any]:
    """A Deployment's, StatefulSet's or Job's first container."""
    container: dict[str, Any] = obj["spec"]["template"]["spec"]["containers"][0]
    return container
