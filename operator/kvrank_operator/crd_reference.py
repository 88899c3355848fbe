"""The RankerDeployment reference page (``docs/reference/rankerdeployment.md``), generated
from the CRD's own schema: every field with its type, default, bounds and description, the
cross-field rules the API server enforces, and the printer columns. What the page says is
what ``kubectl apply`` checks, because both come from :func:`kvrank_operator.crd.crd`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from kvrank_operator.crd import crd

CORE = re.compile(r"\(core/v1 (\w+)\)$")
BOUNDS = (
    ("minimum", "≥ {}"),
    ("maximum", "≤ {}"),
    ("minLength", "length ≥ {}"),
    ("maxLength", "length ≤ {}"),
    ("minItems", "≥ {} items"),
    ("maxItems", "≤ {} items"),
    ("maxProperties", "≤ {} keys"),
)


def _type(schema: dict[str, Any]) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "integer or string"
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema:
        return f"map of {_type(schema['additionalProperties'])}"
    if kind == "object" and schema.get("x-kubernetes-preserve-unknown-fields"):
        return "object (not checked)"
    return str(kind)


def _constraints(schema: dict[str, Any]) -> str:
    out = [fmt.format(schema[key]) for key, fmt in BOUNDS if key in schema]
    if "enum" in schema:
        out.append("one of " + ", ".join(f"`{v}`" for v in schema["enum"]))
    if "pattern" in schema:
        out.append(f"pattern `{schema['pattern']}`")
    if "format" in schema:
        out.append(f"format {schema['format']}")
    return "; ".join(out)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _core_type(schema: dict[str, Any]) -> str | None:
    """The Kubernetes type an embedded core schema is (``crd._core`` names it last in the
    description): the page names it instead of listing Kubernetes' own fields."""
    found = CORE.search(schema.get("description", ""))
    return found.group(1) if found else None


def _rows(schema: dict[str, Any], path: str, required: bool) -> Iterator[str]:
    default = f"`{json.dumps(schema['default'])}`" if "default" in schema else ""
    name = f"`{path}`" + (" (required)" if required else "")
    core = _core_type(schema) or _core_type(schema.get("items", {}))
    kind = _type(schema) if core is None else _type(schema).replace("object", f"core/v1 {core}")
    cells = (name, kind, default, _constraints(schema), schema.get("description", ""))
    yield "| " + " | ".join(_cell(c) for c in cells) + " |"
    if core is not None:
        return
    needed = set(schema.get("required", []))
    for key, child in schema.get("properties", {}).items():
        yield from _rows(child, f"{path}.{key}", key in needed)
    items = schema.get("items", {})
    for key, child in items.get("properties", {}).items():
        yield from _rows(child, f"{path}[].{key}", key in set(items.get("required", [])))


def _rules(schema: dict[str, Any], path: str) -> Iterator[str]:
    for rule in schema.get("x-kubernetes-validations", []):
        where = path + rule.get("fieldPath", "")
        yield f"- `{where}` {rule['message']} (`{_cell(rule['rule'])}`)"
    for key, child in schema.get("properties", {}).items():
        yield from _rules(child, f"{path}.{key}")
    items = schema.get("items", {})
    for key, child in items.get("properties", {}).items():
        yield from _rules(child, f"{path}[].{key}")


def markdown() -> str:
    """The reference page, whole."""
    doc = crd()
    version = doc["spec"]["versions"][0]
    group, kind = doc["spec"]["group"], doc["spec"]["names"]["kind"]
    root = version["schema"]["openAPIV3Schema"]
    lines = [
        f"# {kind} reference ({group}/{version['name']})",
        "",
        "Generated from the CRD's schema by `kvrank-operator crd --reference` (`make crd`);"
        " edit `operator/kvrank_operator/crd.py`, not this page. `kubectl explain"
        f" {doc['spec']['names']['plural']}.spec` reads the same descriptions from a cluster.",
        "",
        "## Fields",
        "",
        "| Field | Type | Default | Constraints | Description |",
        "|---|---|---|---|---|",
        *_rows(root["properties"]["spec"], "spec", True),
        *_rows(root["properties"]["status"], "status", False),
        "",
        "## Cross-field rules",
        "",
        "Checked by the API server at apply (CEL); the message names the field.",
        "",
        *_rules(root["properties"]["spec"], "spec"),
        "",
        "## Columns of `kubectl get`",
        "",
        "| Column | Type | From | Description |",
        "|---|---|---|---|",
        *(
            f"| {c['name']} | {c['type']} | `{c['jsonPath']}` | {_cell(c.get('description', ''))} |"
            for c in version["additionalPrinterColumns"]
        ),
        "",
        "## Subresources",
        "",
        *_subresources(version.get("subresources", {})),
        "",
    ]
    return "\n".join(lines)


def _subresources(subresources: dict[str, Any]) -> Iterator[str]:
    if "status" in subresources:
        yield "- `status`: written by the operator only; a spec change does not touch it."
    if (scale := subresources.get("scale")) is not None:
        yield (
            f"- `scale` (`kubectl scale`, an HPA): replicas `{scale['specReplicasPath']}`,"
            f" reported `{scale['statusReplicasPath']}`, selector"
            f" `{scale.get('labelSelectorPath', '')}`."
        )
