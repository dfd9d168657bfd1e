"""docs/architecture.md's budget table is true: one row per room of the package, today's
count within a tenth of the code's, "over" exactly where a room is over its budget, and no
module over 600 lines."""

from __future__ import annotations

import re
from pathlib import Path

import oncewire

PACKAGE = Path(oncewire.__file__).parent
PAGE = PACKAGE.parents[1] / "docs" / "architecture.md"
SHARED = ("storage/sqlguard.py", "storage/transaction.py", "storage/postgres/caller.py")
MODULE_LIMIT = 600


def _lines(paths: list[Path]) -> int:
    return sum(len(path.read_text(encoding="utf-8").splitlines()) for path in paths)


def _python(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def _measured() -> dict[str, int]:
    rooms = {
        f"`{d.name}`": _lines(_python(d))
        for d in sorted(PACKAGE.iterdir())
        if (d / "__init__.py").exists() and d.name != "storage"
    }
    shared = [PACKAGE / name for name in SHARED]
    storage = [p for p in _python(PACKAGE / "storage") if p not in shared]
    rooms["`storage` (but the shared transaction)"] = _lines(storage)
    rooms["`storage`, the shared transaction"] = _lines(shared)
    rooms["the modules at the top"] = _lines(sorted(PACKAGE.glob("*.py")))
    return rooms


def _table() -> dict[str, tuple[int, int, bool]]:
    section = PAGE.read_text(encoding="utf-8").split("## The budget", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[int, int, bool]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not re.fullmatch(r"[\d,]+", cells[2]):
            continue
        today = re.fullmatch(r"([\d,]+)( over)?", cells[3])
        assert today is not None, f"today's count of {cells[0]}: {cells[3]!r}"
        rows[cells[0]] = (
            int(cells[2].replace(",", "")),
            int(today[1].replace(",", "")),
            bool(today[2]),
        )
    return rows


def test_every_room_has_a_row_and_its_count_is_true() -> None:
    measured, table = _measured(), _table()
    assert sorted(table) == sorted(measured)
    for room, lines in measured.items():
        budget, shown, over = table[room]
        assert abs(shown - lines) <= lines / 10, (
            f"{room}: the table shows {shown}, the code has {lines}"
        )
        assert over == (lines > budget), f"{room}: {lines} lines against a budget of {budget}"


def test_no_module_is_over_the_limit() -> None:
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in _python(PACKAGE)
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LIMIT
    }
    assert long == {}
