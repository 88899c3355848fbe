"""A document checked against the CRD's OpenAPI schema offline, as the API server's
structural validation checks it at apply: unknown fields (which the API server would drop,
or refuse under strict field validation), types, enums, patterns, lengths and bounds.

What it does not run are the CEL rules (``x-kubernetes-validations``): cross-field checks
the API server evaluates at apply. Pure: a value and a schema in, the problems out, each
naming its field as ``kubectl`` does (``spec.cache.redis.shards``).
"""

from __future__ import annotations

import re
from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
}


def problems(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Every way ``value`` (at ``path``) breaks ``schema``: ``"<field>: <problem>"``."""
    if value is None:
        return [] if schema.get("nullable") else [f"{path}: must not be null"]
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, str | int) and not isinstance(value, bool)
        return [] if ok else [f"{path}: must be an integer or a string"]
    if "anyOf" in schema and not any(not problems(value, s, path) for s in schema["anyOf"]):
        return [f"{path}: matches none of its allowed forms"]
    kind = schema.get("type")
    if kind is not None and not _is(value, kind):
        return [f"{path}: must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}"]
    out = _scalar(value, schema, path)
    if isinstance(value, dict):
        out += _fields(value, schema, path)
    elif isinstance(value, list):
        out += _items(value, schema, path)
    return out


def _is(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return kind == "boolean"
    return isinstance(value, _TYPES.get(kind, (object,)))


def _scalar(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    out = []
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(map(str, schema["enum"]))
        out.append(f"{path}: {value!r} is not one of {allowed}")
    if isinstance(value, str):
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            out.append(f"{path}: {value!r} must match {schema['pattern']}")
        if len(value) > schema.get("maxLength", len(value)):
            out.append(f"{path}: longer than {schema['maxLength']} characters")
        if len(value) < schema.get("minLength", 0):
            out.append(f"{path}: shorter than {schema['minLength']} characters")
    if isinstance(value, int | float) and not isinstance(value, bool):
        out += _bounds(value, schema, path)
    return out


def _bounds(value: float, schema: dict[str, Any], path: str) -> list[str]:
    out = []
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None:
        exclusive = schema.get("exclusiveMinimum") is True
        if value < low or (exclusive and value == low):
            out.append(f"{path}: should be greater than {'' if exclusive else 'or equal to '}{low}")
    if high is not None:
        exclusive = schema.get("exclusiveMaximum") is True
        if value > high or (exclusive and value == high):
            out.append(f"{path}: should be less than {'' if exclusive else 'or equal to '}{high}")
    return out


def _fields(value: dict[str, Any], schema: dict[str, Any], path: str) -> list[str]:
    out = [f"{path}.{name}: required" for name in schema.get("required", ()) if name not in value]
    props: dict[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    for name, item in value.items():
        where = f"{path}.{name}"
        if name in props:
            out += problems(item, props[name], where)
        elif isinstance(extra, dict):
            out += problems(item, extra, where)
        elif not (extra or schema.get("x-kubernetes-preserve-unknown-fields")):
            known = ", ".join(sorted(props)) or "none"
            out.append(f"{where}: unknown field (known here: {known})")
    return out


def _items(value: list[Any], schema: dict[str, Any], path: str) -> list[str]:
    out = []
    if len(value) > schema.get("maxItems", len(value)):
        out.append(f"{path}: more than {schema['maxItems']} items")
    if len(value) < schema.get("minItems", 0):
        out.append(f"{path}: fewer than {schema['minItems']} items")
    if "items" in schema:
        for i, item in enumerate(value):
            out += problems(item, schema["items"], f"{path}[{i}]")
    return out
