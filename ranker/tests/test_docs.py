"""The documentation a newcomer reads first: the README's first screen names the three ways
in, and every link between the pages leads somewhere (a file that exists, a heading that is
there)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def prose(page: Path) -> str:
    """The page without its code (blocks and spans), where brackets are not links."""
    return CODE.sub("", FENCE.sub("", page.read_text()))


def slug(heading: str) -> str:
    """The anchor a Markdown heading gets (GitHub's rule)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_the_readme_names_the_three_ways_in_on_its_first_screen() -> None:
    first = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    for way in (
        "#1-on-your-machine-no-cluster",
        "#2-a-cluster-in-10-minutes",
        "#3-bring-your-own-model",
    ):
        assert f"]({way})" in first, way
    assert "make test" in first and "minutes" in first and "root" in first


def test_every_link_between_the_pages_leads_to_a_file_and_heading_that_exist() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(prose(page)):
            if re.match(r"^(https?|mailto):", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []
