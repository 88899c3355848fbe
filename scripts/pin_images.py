"""Pins a chart's ``values.yaml`` to the images a release pushed: each image's repository,
tag and digest set in place, every other line (the ``@param`` comments ``helm show values``
prints, the other values) left as it was.

Usage: ``python scripts/pin_images.py VALUES IMAGES TAG``, where IMAGES is what
``scripts/push-images.sh`` wrote: one line ``NAME REPOSITORY@sha256:…`` per image. The
operator's image is ``image``; the ranker, redis and router images are ``defaultImages``'
(what the operator runs for a RankerDeployment that names none). An image the file does not
name keeps its values; a name the chart has no place for is an error, as is a line that is
not a digest reference.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

SLOTS: dict[str, tuple[str, ...]] = {
    "operator": ("image",),
    "ranker": ("defaultImages", "ranker"),
    "redis": ("defaultImages", "redis"),
    "router": ("defaultImages", "router"),
}
"""Where each pushed image goes in the chart's values."""
PUBLISHED_ONLY = frozenset({"ranker-sasrec", "ranker-quickstart"})
"""Images a release pushes that the chart does not run (examples name them)."""
MODEL_IMAGE = re.compile(r"^[a-z0-9-]+-model:[A-Za-z0-9_.-]+$")
"""The examples' model images (``NAME-model:VERSION``): published, never run by the chart."""
DIGEST_REF = re.compile(r"^(?P<repository>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})$")
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<rest>.*)$")


def read_images(text: str) -> dict[str, tuple[str, str]]:
    """``NAME REPOSITORY@sha256:…`` lines → name → (repository, digest)."""
    images = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, _, ref = line.strip().partition(" ")
        found = DIGEST_REF.match(ref.strip())
        if found is None:
            raise ValueError(f"line {number}: {line!r} is not 'NAME REPOSITORY@sha256:<64 hex>'")
        if name not in SLOTS and name not in PUBLISHED_ONLY and not MODEL_IMAGE.match(name):
            raise ValueError(f"line {number}: the chart runs no image named {name!r}")
        images[name] = (found["repository"], found["digest"])
    return images


def pinned(values: str, images: dict[str, tuple[str, str]], tag: str) -> str:
    """``values`` with each image of ``images`` (that the chart runs) pinned, at ``tag``."""
    wanted = {
        SLOTS[name]: {"repository": repository, "tag": tag, "digest": digest}
        for name, (repository, digest) in images.items()
        if name in SLOTS
    }
    path: list[tuple[int, str]] = []  # the mapping keys enclosing the current line
    lines = []
    for line in values.splitlines(keepends=True):
        found = KEY_LINE.match(line.rstrip("\n"))
        if found is None or line.lstrip().startswith("#"):
            lines.append(line)
            continue
        indent = len(found["indent"])
        while path and path[-1][0] >= indent:
            path.pop()
        parent = tuple(key for _, key in path)
        fields = wanted.get(parent)
        if fields is not None and found["key"] in fields:
            line = f"{found['indent']}{found['key']}: {json.dumps(fields[found['key']])}\n"
        lines.append(line)
        if not found["rest"].strip():  # a mapping (or list) starts here
            path.append((indent, found["key"]))
    out = "".join(lines)
    check(yaml.safe_load(out), wanted)
    return out


def check(doc: dict[str, object], wanted: dict[tuple[str, ...], dict[str, str]]) -> None:
    """Every slot of ``wanted`` holds its fields in the parsed result (a values file without
    one of the fields would have been left unpinned)."""
    for slot, fields in wanted.items():
        node: object = doc
        for key in slot:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict) or any(node.get(k) != v for k, v in fields.items()):
            raise ValueError(f"values.yaml has no {'.'.join(slot)}.{{repository,tag,digest}}")


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    values, images, tag = Path(argv[0]), Path(argv[1]), argv[2]
    try:
        values.write_text(pinned(values.read_text(), read_images(images.read_text()), tag))
    except ValueError as exc:
        print(f"pin_images: {images}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
