"""CRDs on the session's API server, and what it would admit: helpers of the tests that
install third-party CRDs (prometheus-operator's, the Gateway API's, KEDA's) beside ours."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from pathlib import Path

from kvrank_operator.crd import crd

LOCALKUBE = Path(__file__).resolve().parents[2] / "e2e" / "localkube"


def fetched_crds(script: str) -> Path:
    """The directory of CRD files that ``e2e/localkube/<script>`` fetched (and cached)."""
    out = subprocess.run(
        ["bash", str(LOCALKUBE / script)], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


def install_crds(cluster, paths: Iterable[Path], names: Iterable[str], ours: bool = False) -> None:  # type: ignore[no-untyped-def]
    """The CRD files at ``paths`` (and, with ``ours``, the RankerDeployment CRD) applied to
    the session's API server, once the CRDs ``names`` are Established."""
    for path in paths:
        cluster.kubectl("apply", "--server-side", "-f", str(path))
    if ours:
        cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(crd())
        )
    for name in (*names, *(["rankerdeployments.kvrank.io"] if ours else [])):
        cluster.wait_established(name)


def strict_dry_run(cluster, doc: dict, namespace: str | None = None) -> tuple[bool, str]:  # type: ignore[no-untyped-def, type-arg]
    """Whether the API server would admit ``doc`` (a strict server-side dry run; into
    ``namespace`` when given), and why not."""
    if namespace is not None:
        doc = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
    out = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-f", "-",
        input=json.dumps(doc), check=False,
    )  # fmt: skip
    return out.returncode == 0, out.stderr
