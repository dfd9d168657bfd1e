"""The layers hold: nothing below the Ledger imports it, ledgers reach each other only through
what they are given, and the import-linter contract in pyproject.toml is kept."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import oncewire
from oncewire import Ledger
from oncewire.effects import Effects
from oncewire.inbound import Inbox
from oncewire.replies import Replies
from oncewire.runs import Runs
from oncewire.runs.review import ReviewCommands
from oncewire.testing import ManualClock

PACKAGE = Path(oncewire.__file__).parent
LEDGERS = ("effects", "inbound", "receipts", "replies", "runs")
BELOW_THE_LEDGER = (*LEDGERS, "storage", "core")
# The reply engine lives beside the reply ledger but sits above the Ledger it is given, like
# the dispatcher: it alone may name the Ledger's type.
ABOVE_THE_LEDGER = {PACKAGE / "replies" / "engine.py"}


def _modules(*packages: str) -> list[Path]:
    return [p for name in packages for p in sorted((PACKAGE / name).rglob("*.py"))]


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
        return [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return []


def test_nothing_below_the_ledger_imports_it_not_even_for_type_checking() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)}:{node.lineno} imports {name}"
        for path in _modules(*BELOW_THE_LEDGER)
        if path not in ABOVE_THE_LEDGER
        for node in ast.walk(ast.parse(path.read_text()))
        for name in _imported(node)
        if name in ("oncewire", "oncewire.ledger")
        or name.startswith("oncewire.ledger.")
        or name.endswith((".Ledger", ".LedgerTransaction"))
        or name.startswith(("oncewire.dispatch", "oncewire.cli", "oncewire.lab"))
    ]
    assert offenders == []


def test_no_ledger_imports_a_sibling_lazily_inside_a_function() -> None:
    offenders = []
    for path in _modules(*LEDGERS):
        own = path.relative_to(PACKAGE).parts[0]
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                for name in _imported(node):
                    parts = name.split(".")
                    if parts[0] == "oncewire" and len(parts) > 1 and parts[1] != own:
                        offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}")
    assert offenders == []


def test_no_ledger_module_reaches_into_another_objects_privates() -> None:
    # `self._x` is an object's own state; `runs._append_in_tx` or `runs._ledger.store` is a
    # pipeline used from outside: it goes through runs/append.py instead.
    offenders = [
        f"{path.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node)}"
        for path in [*_modules(*LEDGERS), PACKAGE / "ledger.py"]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]
    assert offenders == []


def _names_a_store(node: ast.expr) -> bool:
    last = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    # The gateway's configuration has a [store] section whose `db` is a path, not a driver.
    return last in ("store", "_store") and ast.unparse(node) != "config.store"


def test_nothing_above_storage_reads_a_stores_driver() -> None:
    # The import-linter contract keeps the backends' modules out; this keeps their objects
    # out: what a layer above needs of its backend, the Store says (label, snapshot, ...).
    above = [p for p in sorted(PACKAGE.rglob("*.py")) if "storage" not in p.parts]
    offenders = [
        f"{path.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node)}"
        for path in above
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "db" and _names_a_store(node.value)
    ]
    assert offenders == []


def test_the_ledger_builds_every_ledger_eagerly_over_one_store(tmp_path: Path) -> None:
    with Ledger(str(tmp_path / "app.db"), clock=ManualClock()) as ledger:
        built = vars(ledger)  # attributes, not lazy properties
        assert isinstance(built["effects"], Effects)
        assert isinstance(built["inbound"], Inbox)
        assert isinstance(built["replies"], Replies)
        assert isinstance(built["runs"], Runs)
        assert isinstance(ledger.runs.review, ReviewCommands)
        assert ledger.runs.context.store is ledger.store
        assert ledger.runs.context.effects is ledger.effects
        assert ledger.runs.context.clock is ledger.clock


def test_the_review_commands_live_on_runs_review_only(tmp_path: Path) -> None:
    generic = {"start", "execute", "renew", "get", "list", "events", "phases", "verify"}
    preset = {"record_candidate", "start_review", "complete_review", "propose_action"}
    with Ledger(str(tmp_path / "app.db")) as ledger:
        names = {n for n in dir(ledger.runs) if not n.startswith("_")}
        assert generic <= names
        assert not preset & names
        assert preset <= {n for n in dir(ledger.runs.review) if not n.startswith("_")}


def test_the_import_linter_contract_is_kept() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    if not lint_imports.exists():
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    checkout = PACKAGE.parent.parent
    if not (checkout / "pyproject.toml").exists():
        pytest.skip("oncewire is not installed from a checkout")
    done = subprocess.run(
        [str(lint_imports), "--no-cache"],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout
