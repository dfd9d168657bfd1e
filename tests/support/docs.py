"""The code blocks of the project's pages, for the tests that run what a page shows."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def code_blocks(page: str | Path, language: str = "python") -> list[str]:
    """Every fenced ``language`` block of ``page`` (a path from the project's root, such as
    ``"docs/mcp.md"``, or a Path), in order."""
    path = page if isinstance(page, Path) else ROOT / page
    return re.findall(rf"```{language}\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


def code_block(page: str | Path, first: str = "", language: str = "python") -> str:
    """The one ``language`` block of ``page`` that starts with ``first``."""
    found = [block for block in code_blocks(page, language) if block.startswith(first)]
    assert len(found) == 1, f"{len(found)} {language} blocks of {page} start {first!r}, not one"
    return found[0]
