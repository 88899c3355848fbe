"""The offline structural check ``render`` runs: what the API server's schema validation
would say of a value, field by field (the CRD's own forms included: nullable, int-or-string,
preserve-unknown-fields, anyOf)."""

from __future__ import annotations

from typing import Any

import pytest

from kvrank_operator.crd import SPEC
from kvrank_operator.schema_check import problems

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
        "count": {"type": "integer", "minimum": 1, "maximum": 3},
        "share": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
        "mode": {"type": "string", "enum": ["a", "b"]},
        "memory": {"x-kubernetes-int-or-string": True},
        "note": {"type": "string", "nullable": True},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "items": {"type": "array", "maxItems": 2, "items": {"type": "boolean"}},
        "either": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^x"}]},
    },
}


def test_a_value_the_schema_allows_has_no_problem() -> None:
    value = {
        "name": "abc", "count": 2, "share": 0.5, "mode": "a", "memory": "1Gi", "note": None,
        "free": {"anything": [1, {"at": "all"}]}, "labels": {"k": "v"}, "items": [True],
        "either": "xy",
    }  # fmt: skip
    assert problems(value, SCHEMA, "spec") == []
    assert problems({"name": "a", "memory": 3, "either": 7}, SCHEMA, "spec") == []


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({}, "spec.name: required"),
        ({"name": "ABC"}, "spec.name: 'ABC' must match ^[a-z]+$"),
        ({"name": "abcdef"}, "spec.name: longer than 5 characters"),
        ({"name": "a", "count": "two"}, "spec.count: must be an integer"),
        ({"name": "a", "count": True}, "spec.count: must be an integer"),
        ({"name": "a", "count": 4}, "spec.count: should be less than or equal to 3"),
        ({"name": "a", "share": 0}, "spec.share: should be greater than 0"),
        ({"name": "a", "mode": "c"}, "spec.mode: 'c' is not one of a, b"),
        ({"name": "a", "memory": 1.5}, "spec.memory: must be an integer or a string"),
        ({"name": "a", "count": None}, "spec.count: must not be null"),
        ({"name": "a", "labels": {"k": 1}}, "spec.labels.k: must be a string"),
        ({"name": "a", "items": [True, False, True]}, "spec.items: more than 2 items"),
        ({"name": "a", "items": [1]}, "spec.items[0]: must be a boolean"),
        ({"name": "a", "either": "y"}, "spec.either: matches none of its allowed forms"),
        ({"name": "a", "cuont": 2}, "spec.cuont: unknown field (known here: count, either,"),
    ],
)
def test_each_problem_names_its_field(value: dict[str, Any], problem: str) -> None:
    found = problems(value, SCHEMA, "spec")
    assert any(p.startswith(problem) for p in found), found


def test_every_problem_of_a_spec_is_reported_not_only_the_first() -> None:
    spec = {"model": {"version": "v1", "uri": "/m", "replicas": "one"}, "cahce": {}}
    found = problems(spec, SPEC, "spec")
    assert "spec.model.replicas: must be an integer" in found
    assert any(p.startswith("spec.cahce: unknown field") for p in found), found
