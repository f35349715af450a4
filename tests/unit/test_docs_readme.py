"""README.md's list of the docs names every page of docs/ once, and nothing else."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def listed_pages(readme: str) -> Counter[str]:
    """The pages of the bullet list, `- [docs/x.md](docs/x.md): ...`, with their counts."""
    return Counter(re.findall(r"^- \[(docs/[\w-]+\.md)\]", readme, flags=re.MULTILINE))


def test_readme_lists_every_docs_page_once() -> None:
    listed = listed_pages((REPO / "README.md").read_text())
    pages = {f"docs/{path.name}" for path in (REPO / "docs").glob("*.md")}
    assert sorted(page for page, count in listed.items() if count > 1) == []
    assert sorted(pages - set(listed)) == [], "pages the README does not list"
    assert sorted(set(listed) - pages) == [], "listed pages that do not exist"
