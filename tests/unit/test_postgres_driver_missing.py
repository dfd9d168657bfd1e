"""Without psycopg installed, a PostgreSQL URL gets one clear error saying what to install."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
sys.modules["psycopg"] = None  # as if the postgres extra were not installed
import oncewire
try:
    oncewire.Ledger("postgresql://127.0.0.1:5432/test")
except oncewire.ConfigurationError as exc:
    print(exc)
"""


def test_a_postgresql_url_without_the_driver_names_the_extra() -> None:
    ran = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert "pip install 'oncewire[postgres]'" in ran.stdout


def test_the_cli_says_the_same_in_one_line() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None; "
        "from oncewire.cli import main; sys.exit(main(['effects', 'list', '--db', "
        "'postgresql://127.0.0.1:5432/test']))"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 1
    assert ran.stderr.startswith("error: the PostgreSQL backend needs the 'postgres' extra")
    assert len(ran.stderr.splitlines()) == 1
    assert "Traceback" not in ran.stderr
