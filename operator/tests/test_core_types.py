"""The Kubernetes types a RankerDeployment embeds are checked by the schema the API server
itself uses for them: ``kvrank_operator/core_types.py`` is the conversion of the OpenAPI
document of the Kubernetes release the local cluster runs, and must stay exactly that."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from kvrank_operator import core_types, crd

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("core_types_gen", ROOT / "scripts/core_types.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_vendored_schemas_are_the_conversion_of_the_clusters_release() -> None:
    build = (ROOT / "e2e/localkube/build.sh").read_text()
    release = re.search(r'KUBE_VERSION="\$\{KUBE_VERSION:-(v[0-9.]+)\}"', build)
    assert release is not None
    assert release.group(1) == core_types.KUBERNETES_VERSION, "run `make core-types`"
    gen = _generator()
    document = gen.openapi_document(core_types.KUBERNETES_VERSION)
    assert gen.shortened(gen.convert(document)) == core_types.SCHEMAS, "run `make core-types`"


def _nodes(schema: Any) -> list[dict[str, Any]]:
    if not isinstance(schema, dict):
        return []
    found = [schema]
    for child in (*schema.get("properties", {}).values(), schema.get("items")):
        found += _nodes(child)
    if isinstance(schema.get("additionalProperties"), dict):
        found += _nodes(schema["additionalProperties"])
    return found


def test_the_embedded_schemas_are_structural() -> None:
    """What the API server refuses in a CRD: a reference or a union; a list map whose keys
    may be missing (the defaults that fill them in a Pod are not carried over)."""
    root = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for node in _nodes(root):
        assert not {"$ref", "allOf", "oneOf"} & set(node), node
        if node.get("x-kubernetes-list-type") == "map":
            required = set(node["items"].get("required", []))
            assert set(node["x-kubernetes-list-map-keys"]) <= required, node
    quantities = [n for n in _nodes(root) if n.get("pattern") == _generator().QUANTITY_PATTERN]
    assert quantities and all(n["x-kubernetes-int-or-string"] for n in quantities)
