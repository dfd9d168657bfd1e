"""Each floor is typed against its seam of the store (``oncewire.storage.store``): mypy then
refuses a call to a verb outside it. These tests hold the floors to naming their seam, so that
typing one of them against the whole ``Store`` again cannot pass unseen, and check that every
seam is part of the ``Store`` the Ledger hands out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from oncewire.storage import store as store_module

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "oncewire"

# A floor, and the store types its modules may name.
SEAMS: dict[str, set[str]] = {
    "effects": {"EffectStore"},
    "dispatch": {"EffectStore"},
    "receipts": {"ReceiptStore"},
    "inbound": {"InboundStore"},
    "replies": {"ReplyStore"},
    "runs": {"RunStore"},
    "langgraph": {"LangGraphStore"},
    "agents": {"AgentStore"},
}
# Public constructors that accept the caller's whole Store (``Receipts(store)``,
# ``OncewireSession(id, store)``) and keep only their seam of it.
ACCEPTS_A_STORE = {"receipts/service.py", "agents/session.py"}
STORE_TYPES = {
    name
    for name, value in vars(store_module).items()
    if isinstance(value, type) and name.endswith("Store")
}


def _named_store_types(path: Path) -> set[str]:
    """The store types a module imports from oncewire.storage."""
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("oncewire.storage"):
            named |= {alias.name for alias in node.names if alias.name in STORE_TYPES}
    return named


@pytest.mark.parametrize("floor", sorted(SEAMS))
def test_a_floor_names_only_its_seam_of_the_store(floor: str) -> None:
    stray = {}
    for path in sorted((PACKAGE / floor).rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        allowed = SEAMS[floor] | ({"Store"} if relative in ACCEPTS_A_STORE else set())
        named = _named_store_types(path) - allowed
        if named:
            stray[relative] = sorted(named)
    assert stray == {}, f"typed against another store type than its seam: {stray}"


def test_every_seam_is_part_of_the_store() -> None:
    seams = {name for names in SEAMS.values() for name in names}
    assert seams <= STORE_TYPES
    for name in seams:
        seam = getattr(store_module, name)
        assert issubclass(store_module.Store, seam), name
        assert issubclass(seam, store_module.StoreCore), name


def test_the_check_sees_an_import_of_the_whole_store(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from oncewire.storage import Store, Transaction\n")
    assert _named_store_types(module) == {"Store"}
