"""The model artifacts the scenarios serve, and the in-cluster store they are fetched from.

:func:`write_models` writes every version's artifact once per run (the built-in ranker's,
halved, and the example plugin's); :func:`artifact_store` is the objects of an HTTP store
serving them from a ConfigMap (Pod Security ``restricted`` forbids hostPath volumes), so
model URIs work on any backend.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import artifact_server

from kvrank.model.artifact import save_model, save_ranker
from kvrank.model.config import TINY
from kvrank.model.ranker import RankerModel

ARTIFACTS = "artifacts"
ARTIFACTS_PORT = 8000
S3_BUCKET = "models"
"""The bucket of the S3 store (local backend): the artifact store's files under ``s3://``."""
SLOW_PREFIX = "/slow"
SLOW_DELAY_S = 25
"""Below ``/slow/`` each answer of the store waits ``SLOW_DELAY_S`` first (a model store far
away, or a large model)."""

HALVED = ("d_model", "n_heads", "max_events", "ns_tokens", "cand_tokens", "emb_dim")
MODEL_CONFIG = TINY.model_copy(
    update={k: getattr(TINY, k) // 2 for k in HALVED}
    | {"n_layers": 2, "profile_buckets": 100, "n_categories": 64}
)
"""The test suites' ``TINY``, halved: the scenarios test serving and operations, not ranking
quality, and every version they serve sits in one ConfigMap, which the API server caps at
3 MiB (an artifact of ~100 KB, not ~800 KB)."""

SEEDS = {"v1": 0, "v2": 1, "v3": 2, "v4": 3, "v2.1": 1}
"""One seed per version (different scores), except ``v2.1``: ``v2``'s weights under another
version (a rebuild that changed nothing), so its scores equal ``v2``'s."""

PLUGIN = "sasrec-ranker"
PLUGIN_CONFIG = {"n_items": 300, "n_genres": 7, "d_model": 16, "n_heads": 2, "window": 12}
"""A small config of the example plugin (``examples/sasrec``), served from its own image."""
PLUGIN_VERSIONS = {"s1": (0, False), "s2": (1, False), "s3": (2, True)}
"""version → (seed, listwise): ``s3`` lets candidates see the slate, which its pods refuse."""


def write_models(root: Path) -> Path:
    """``root/feed-ranker/<version>`` artifacts of every version in :data:`SEEDS`, and
    ``root/sasrec-ranker/<version>`` of the example plugin's in :data:`PLUGIN_VERSIONS`."""
    import torch
    from kvrank_sasrec.model import build

    for version, seed in SEEDS.items():
        target = root / "feed-ranker" / version
        if (target / "config.json").exists():
            continue
        torch.manual_seed(seed)
        save_model(RankerModel(MODEL_CONFIG, version), target)
    for version, (seed, listwise) in PLUGIN_VERSIONS.items():
        torch.manual_seed(seed)
        plugin = build({**PLUGIN_CONFIG, "slate_context": listwise}, version)
        config = plugin.cfg.model_dump(mode="json")
        save_ranker(plugin, root / PLUGIN / version, "sasrec", config)
    return root


def artifact_store(models: Path, image: str) -> list[dict[str, Any]]:
    """An in-cluster HTTP artifact store serving ``models``: a ConfigMap of the files, and a
    Deployment and Service of :mod:`artifact_server` run from the ranker image."""
    files = sorted(p for p in models.rglob("*") if p.is_file())
    keys = {p: re.sub(r"[^A-Za-z0-9._-]", ".", str(p.relative_to(models))) for p in files}
    items = [{"key": keys[p], "path": str(p.relative_to(models))} for p in files]
    labels = {"app.kubernetes.io/name": ARTIFACTS}
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": ARTIFACTS},
            "binaryData": {keys[p]: base64.b64encode(p.read_bytes()).decode() for p in files},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": ARTIFACTS, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": _server_pod(image, items)},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": ARTIFACTS},
            "spec": {"selector": labels, "ports": [{"name": "http", "port": ARTIFACTS_PORT}]},
        },
    ]


def _server_pod(image: str, items: list[dict[str, str]]) -> dict[str, Any]:
    """The store's pod: the server's source passed on its command line, the files mounted
    from the ConfigMap (``items``: key → path), ``restricted`` throughout."""
    source = Path(artifact_server.__file__).read_text()
    args = [str(ARTIFACTS_PORT), SLOW_PREFIX, str(SLOW_DELAY_S)]
    return {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "http",
                "image": image,
                "command": ["python", "-c", source, *args],
                "ports": [{"name": "http", "containerPort": ARTIFACTS_PORT}],
                "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 2},
                "volumeMounts": [{"name": "files", "mountPath": "/artifacts"}],
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
        "volumes": [{"name": "files", "configMap": {"name": ARTIFACTS, "items": items}}],
    }
