"""Spec fragments several operator test modules apply or build from."""

from __future__ import annotations

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
