"""kube-score over everything kvrank puts in a cluster: the chart rendered with its default
values and with every ``ci/`` values file, and ``kvrank-operator render`` of every example.

A CRITICAL finding fails the lint unless its check is on ``lint/kube-score-ignore.yaml``,
where each check kvrank deliberately does not follow says why. WARNINGs are printed, not
failed. Usage: ``python scripts/kube_score_lint.py --kube-score BIN --helm BIN [FILE ...]``
(FILEs: more manifests to score, e.g. a deliberately bad one in a test).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "docs" / "templates"
CHART = ROOT / "charts" / "kvrank-operator"
IGNORE = ROOT / "lint" / "kube-score-ignore.yaml"
GRADES = {1: "CRITICAL", 5: "WARNING"}
KUBE_VERSION = "1.37.2"


def ignored(path: Path = IGNORE) -> tuple[dict[str, set[str] | None], list[str]]:
    """``(check id → the manifests it is not followed in (None: all), kube-score flags that
    turn off part of a check)``; each entry must say why, and one with ``only`` names the
    manifests (``chart-<ci values file>``, ``example-<file>``) where that reason holds."""
    entries = yaml.safe_load(path.read_text()) or []
    checks: dict[str, set[str] | None] = {}
    flags = []
    for e in entries:
        if not str(e.get("reason", "")).strip():
            sys.exit(f"{path}: {e.get('check')!r} has no reason")
        if e.get("flag"):
            flags.append(str(e["flag"]))
        else:
            checks[str(e["check"])] = set(e["only"]) if e.get("only") else None
    return checks, flags


def skipped(row: dict[str, str], checks: dict[str, set[str] | None]) -> bool:
    if row["check"] not in checks:
        return False
    where = checks[row["check"]]
    return where is None or row["manifest"] in where


def manifests(helm: str, workdir: Path) -> list[Path]:
    """The chart rendered per values file, and the operator's render of every example."""
    out = []
    for values in [None, *sorted((CHART / "ci").glob("*.yaml"))]:
        name = "chart-default" if values is None else f"chart-{values.stem}"
        args = [helm, "template", "kvrank", str(CHART), "--namespace", "kvrank-system",
                "--kube-version", KUBE_VERSION]  # fmt: skip
        if values is not None:
            args += ["-f", str(values)]
        out.append(_write(workdir / f"{name}.yaml", _run(args)))
    cli = str(Path(sys.executable).parent / "kvrank-operator")
    shipped = [*sorted((ROOT / "examples").glob("*.yaml")), *sorted(TEMPLATES.glob("*.yaml"))]
    for example in shipped:
        rendered = _run([cli, "render", "-f", str(example), "--namespace", "prod", "--pod-monitor"])
        out.append(_write(workdir / f"example-{example.name}", rendered))
    # the objects the examples bring beside their RankerDeployments (a claim's publishing
    # Job, an artifact server), as they are
    out += sorted((ROOT / "examples" / "model-store").glob("*.yaml"))
    return out


def findings(kube_score: str, files: list[Path], flags: list[str]) -> list[dict[str, str]]:
    """Every CRITICAL and WARNING, one row each, naming the manifest it is in."""
    return [row for f in files for row in _findings(kube_score, f, flags)]


def _findings(kube_score: str, file: Path, flags: list[str]) -> list[dict[str, str]]:
    result = subprocess.run(
        [kube_score, "score", "--output-format", "json", "--kubernetes-version", "v1.37",
         *flags, str(file)],
        capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode not in (0, 1):  # 1: findings; anything else: it could not score
        sys.exit(f"kube-score failed ({result.returncode}): {result.stderr.strip()}")
    rows = []
    for obj in json.loads(result.stdout or "[]"):
        where = f"{obj['type_meta']['kind']} {obj['object_meta'].get('name', '?')}"
        source = obj.get("file_name", "")
        for check in obj.get("checks") or []:
            if check.get("skipped") or check["grade"] not in GRADES:
                continue
            comments = "; ".join(
                f"{c.get('path', '')} {c.get('summary', '')}".strip()
                for c in check.get("comments") or []
            )
            rows.append(
                {
                    "grade": GRADES[check["grade"]],
                    "check": check["check"]["id"],
                    "object": where,
                    "file": Path(source).name,
                    "manifest": file.stem,
                    "why": comments,
                }
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kube-score", required=True)
    parser.add_argument("--helm", required=True)
    parser.add_argument("--ignore", type=Path, default=IGNORE)
    parser.add_argument("extra", nargs="*", type=Path)
    args = parser.parse_args()
    skip, flags = ignored(args.ignore)
    with tempfile.TemporaryDirectory(prefix="kube-score-") as tmp:
        files = [*manifests(args.helm, Path(tmp)), *args.extra]
        rows = findings(args.kube_score, files, flags)
    critical = [r for r in rows if r["grade"] == "CRITICAL" and not skipped(r, skip)]
    warnings = [r for r in rows if r["grade"] == "WARNING" and not skipped(r, skip)]
    for r in warnings + critical:
        print(f"{r['grade']:8} {r['check']:40} {r['object']} ({r['file']}): {r['why']}")
    print(
        f"kube-score: {len(files)} files, {len(critical)} CRITICAL and {len(warnings)} WARNING"
        f" outside {args.ignore.name} ({len(skip) + len(flags)} checks deliberately not followed)"
    )
    return 1 if critical else 0


def _run(args: list[str]) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


if __name__ == "__main__":
    sys.exit(main())
