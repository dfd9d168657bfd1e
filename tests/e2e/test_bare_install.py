"""``pip install oncewire`` with no extras: the CLI, the library and the crash lab still work.

Every other test runs on a full install, so an import of an optional dependency at the wrong
place would break every command for a user without it and no other test would notice. Here a
fresh virtual environment gets the package and its required dependencies only (click), and the
commands run there as a user runs them. Each command that needs an extra says which one, in
one line, with no traceback.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from oncewire.core.extras import EXTRAS

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = sorted({module for modules in EXTRAS.values() for module in modules} | {"fastapi"})

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with ``pip install <this checkout>`` and nothing else."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # The package's own build backend (setuptools) is there already; skip the isolated build
    # environment so that nothing but the package and click is fetched.
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "setuptools>=77", "wheel"], check=True
    )
    build = tmp_path_factory.mktemp("build")
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-build-isolation",
            "--no-cache-dir",
            str(ROOT),
        ],
        check=True,
        cwd=build,
    )
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.lower()
    for module in OPTIONAL:
        assert f"{module.replace('_', '-')}==" not in listed, f"{module} came with the package"
    return venv


def run(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ONCEWIRE_", "PYTHON"))}
    return subprocess.run(
        [str(venv / "bin" / "oncewire"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def test_the_optional_modules_cannot_be_imported_there(bare: Path, tmp_path: Path) -> None:
    code = (
        "import importlib.util, sys; "
        "print([m for m in sys.argv[1:] if importlib.util.find_spec(m)])"
    )
    found = subprocess.run(
        [str(bare / "bin" / "python"), "-c", code, *OPTIONAL],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    assert found.stdout.strip() == "[]"


def test_help_of_every_command(bare: Path, tmp_path: Path) -> None:
    top = run(bare, "--help", cwd=tmp_path)
    assert top.returncode == 0, top.stderr
    assert "needs oncewire[gateway]" in top.stdout and "needs oncewire[ui]" in top.stdout
    for group in ("effects", "receipts", "dispatch", "doctor", "lab", "runs", "inbound", "replies"):
        shown = run(bare, group, "--help", cwd=tmp_path)
        assert shown.returncode == 0, (group, shown.stderr)
        assert "Traceback" not in shown.stderr


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (("gateway", "run", "--config", "gateway.toml"), "gateway"),
        (("gateway", "--help"), "gateway"),
        (("ui", "--db", "app.db"), "ui"),
    ],
)
def test_a_command_that_needs_an_extra_says_which_in_one_line(
    bare: Path, tmp_path: Path, args: tuple[str, ...], extra: str
) -> None:
    done = run(bare, *args, cwd=tmp_path)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"pip install 'oncewire[{extra}]'" in lines[0]
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_postgresql_url_without_psycopg_names_the_extra(bare: Path, tmp_path: Path) -> None:
    done = run(bare, "effects", "list", "--db", "postgresql://127.0.0.1/test", cwd=tmp_path)
    assert done.returncode == 1
    assert "oncewire[postgres]" in done.stderr and "Traceback" not in done.stderr


def test_accept_and_read_back(bare: Path, tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    done = run(
        bare, "effects", "accept", "--db", str(db), "k1", "email", '{"to": "a"}', cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT key, kind, state FROM oncewire_effects").fetchall() == [
        ("k1", "email", "pending")
    ]
    conn.close()
    shown = run(bare, "effects", "show", "--db", str(db), "k1", "--json", cwd=tmp_path)
    assert shown.returncode == 0 and '"pending"' in shown.stdout


def test_the_library_without_extras(bare: Path, tmp_path: Path) -> None:
    code = """
import oncewire
for name in oncewire.__all__:
    getattr(oncewire, name)
from oncewire import Dispatcher, Done, Ledger, Receipts, ReceiptsSink
with Ledger("app.db") as ledger, Receipts("rx.db") as receipts:
    ledger.accept("k1", "ticket", {"n": 1})
    sink = ReceiptsSink(receipts, lambda tx, attempt: {"ticket": attempt.payload["n"]})
    stats = Dispatcher(ledger, {"ticket": sink}).run(until_idle=True, handle_signals=False)
    print(ledger.effects.get("k1").state.value, stats.done)
try:
    import oncewire.otel
except ImportError as exc:
    print("otel:", exc)
"""
    done = subprocess.run(
        [str(bare / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "done 1"
    assert "pip install 'oncewire[otel]'" in lines[1]


def test_the_crash_lab(bare: Path, tmp_path: Path) -> None:
    """The outbox suite passes; a suite that needs an extra is not applicable, and the lab
    still passes."""
    outbox = run(bare, "lab", "--suite", "outbox", cwd=tmp_path)
    assert outbox.returncode == 0, outbox.stderr[-2000:]
    assert outbox.stdout.splitlines()[-1].startswith("PASS: 5 scenarios")
    gateway = run(bare, "lab", "--suite", "gateway", cwd=tmp_path)
    assert gateway.returncode == 0, gateway.stderr[-2000:]
    assert "not applicable" in gateway.stdout
    assert "oncewire[gateway]" in gateway.stdout + gateway.stderr
