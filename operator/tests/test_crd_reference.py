"""The API describes itself: every RankerDeployment field carries a description (what
``kubectl explain`` prints), and the reference page in docs/ is generated from the same
schema, so it cannot drift from what the API server checks."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvrank_operator.crd import crd
from kvrank_operator.crd_descriptions import DESCRIPTIONS
from kvrank_operator.crd_reference import markdown

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "rankerdeployment.md"


def _fields(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    for key, child in schema.get("properties", {}).items():
        here = f"{path}.{key}" if path else key
        yield here, child
        yield from _fields(child, here)
        if "items" in child:
            yield from _fields(child["items"], f"{here}[]")


def _root() -> dict[str, Any]:
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_every_field_has_a_description() -> None:
    missing = [path for path, schema in _fields(_root()) if not schema.get("description")]
    assert missing == []


def test_every_written_description_names_a_field_that_exists() -> None:
    paths = {path for path, _ in _fields(_root())}
    assert sorted(set(DESCRIPTIONS) - paths) == []


def test_the_reference_page_is_generated_from_the_schema() -> None:
    page = PAGE.read_text()
    assert page == markdown(), "docs/reference/rankerdeployment.md is stale: run `make crd`"
    # what a reader looks up: a field with its default and bounds, a rule, a column
    assert "| `spec.cache.redis.shards` | integer | `3` | ≥ 3; ≤ 64 |" in page
    assert "is required when ttl.mode is fixed" in page
    assert "| HIT-RATIO |" in page.upper()


def test_the_operator_cli_prints_the_page() -> None:
    out = subprocess.run(
        [str(Path(sys.executable).parent / "kvrank-operator"), "crd", "--reference"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout == PAGE.read_text()
