"""Fails naming every function longer than the house limit (60 lines from ``def`` to its
last line, docstring included) in the product's packages and the end-to-end suite (whose
scenarios read as steps too): a function that long does several things, each of which wants
a name. Run by ``make lint``."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

LIMIT = 60
PACKAGES = ("operator/kvrank_operator", "ranker/kvrank", "ranker/kvrank_common", "e2e")


def too_long(root: Path) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > LIMIT:
                        where = path.relative_to(root)
                        found.append(f"{where}:{node.lineno} {node.name}: {lines} lines")
    return found


if __name__ == "__main__":
    long = too_long(Path(__file__).resolve().parents[1])
    for line in long:
        print(f"{line} (limit {LIMIT})")
    sys.exit(1 if long else 0)
