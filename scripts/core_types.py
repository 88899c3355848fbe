"""Writes ``kvrank_operator/core_types.py``: the Kubernetes core types a RankerDeployment embeds
(resources, tolerations, affinity, a volume source, an env var's ``valueFrom``) as CRD
schemas, taken from the OpenAPI v3 document the API server of that release serves
(``api/openapi-spec/v3/api__v1_openapi.json`` in the ``k8s.io/kubernetes`` module).

A CRD schema cannot hold ``$ref``: each type is inlined with everything it refers to.
Quantities and int-or-strings become the structural ``x-kubernetes-int-or-string`` form
(quantities with the API server's own pattern, so ``cpu: two`` is refused at apply);
defaults, patch strategies and unions are dropped (they mean nothing in a CRD), embedded
object metadata is kept as a free object, and each description is cut to its first sentence.

    python scripts/core_types.py [KUBE_VERSION] | ruff format - > OUT

(``make core-types`` writes operator/kvrank_operator/core_types.py; the module proxy must
serve the release). A test converts the same
document again and compares.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SPEC = "api/openapi-spec/v3/api__v1_openapi.json"
CORE = "io.k8s.api.core.v1."
TYPES = {
    "ResourceRequirements": "ResourceRequirements",
    "Toleration": "Toleration",
    "Affinity": "Affinity",
    "VolumeSource": "Volume",
    "EnvVarSource": "EnvVarSource",
}
"""The name in ``core_types.SCHEMAS`` → the core/v1 type it is taken from (a volume source
is a ``Volume`` without its ``name``: the operator names the volume)."""
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]"
    r"|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""What ``resource.ParseQuantity`` accepts (the form controller-gen writes into CRDs)."""
SPECIAL: dict[str, dict[str, Any]] = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": True,
        "description": "A quantity: 500m, 2, 1.5Gi, 1e3.",
    },
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": True,
    },
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    },
}
KEPT = {
    "type",
    "format",
    "description",
    "properties",
    "items",
    "additionalProperties",
    "required",
    "enum",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "anyOf",
    "pattern",
}


def openapi_document(kube_version: str) -> dict[str, Any]:
    """The release's core/v1 OpenAPI document, from the Go module cache (downloaded once)."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{kube_version}"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
        env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"},
    )
    doc: dict[str, Any] = json.loads((Path(json.loads(out.stdout)["Dir"]) / SPEC).read_text())
    return doc


def convert(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every type of :data:`TYPES`, inlined and made structural."""
    schemas: dict[str, Any] = document["components"]["schemas"]

    def inline(name: str, seen: tuple[str, ...]) -> dict[str, Any]:
        if name in SPECIAL:
            return dict(SPECIAL[name])
        if name in seen:
            raise ValueError(f"{name} refers to itself ({' -> '.join(seen)}): not inlinable")
        return node(schemas[name], (*seen, name))

    def node(n: dict[str, Any], seen: tuple[str, ...]) -> dict[str, Any]:
        ref = n.get("$ref") or next((a["$ref"] for a in n.get("allOf", []) if "$ref" in a), None)
        if ref is not None:
            out = inline(ref.rsplit("/", 1)[-1], seen)
            if "description" in n:  # the field's own words win over the type's
                out["description"] = n["description"]
            return out
        out = {k: v for k, v in n.items() if k in KEPT}
        if "properties" in out:
            out["properties"] = {k: node(v, seen) for k, v in out["properties"].items()}
        for key in ("items", "additionalProperties"):
            if isinstance(out.get(key), dict):
                out[key] = node(out[key], seen)
        return out

    result = {name: inline(CORE + source, ()) for name, source in TYPES.items()}
    volume = result["VolumeSource"]
    del volume["properties"]["name"]
    volume.pop("required", None)  # only the name
    volume["description"] = (
        "A core/v1 volume source (persistentVolumeClaim, nfs, csi, ...), without a name."
    )
    return result


def first_sentence(text: str) -> str:
    """A description's first sentence: what ``kubectl explain`` needs, at a size that keeps
    the CRD applicable with a client-side ``kubectl apply`` (its annotation holds 256 KiB)."""
    return re.split(r"(?<=[.!?])\s+(?=[A-Z])", text.strip(), maxsplit=1)[0].replace("\n", " ")


def shortened(n: Any) -> Any:
    if isinstance(n, list):
        return [shortened(x) for x in n]
    if not isinstance(n, dict):
        return n
    return {
        k: first_sentence(v) if k == "description" and isinstance(v, str) else shortened(v)
        for k, v in n.items()
    }


def module_text(kube_version: str, schemas: dict[str, dict[str, Any]]) -> str:
    """The module's source (``ruff format`` then lays it out as the repository's code)."""
    body = json.dumps(schemas, indent=4, sort_keys=True).replace(": true", ": True")
    return (
        "# ruff: noqa: E501  (the descriptions are Kubernetes' own, one line each)\n"
        f'"""Kubernetes {kube_version} core/v1 types as CRD schemas: generated by'
        " scripts/core_types.py\n(``make core-types``) from the API server's OpenAPI"
        ' document. Do not edit."""\n\n'
        "from typing import Any\n\n"
        f'KUBERNETES_VERSION = "{kube_version}"\n\n'
        f"SCHEMAS: dict[str, dict[str, Any]] = {body}\n"
    )


def main(argv: list[str]) -> int:
    kube_version = argv[0] if argv else "v1.37.2"
    schemas = shortened(convert(openapi_document(kube_version)))
    sys.stdout.write(module_text(kube_version, schemas))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
