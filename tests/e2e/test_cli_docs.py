"""The examples in README.md and docs/ run as shown: each is cut out of the Markdown and run in a
fresh directory as its own process, and what it stored is read back with plain drivers.

A broken example here is a broken promise to the first person who copies it. The examples with a
transaction run on both backends in test_docs_transactions.py."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import uuid
from contextlib import closing
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.docs import code_blocks
from tests.support.pg import server_url

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(path: Path) -> list[str]:
    return code_blocks(path)


def block(path: Path, first_line: str) -> str:
    found = [b for b in python_blocks(path) if b.startswith(first_line)]
    assert len(found) == 1, f"{path.name}: one python block starting {first_line!r}"
    return found[0]


def run_python(code: str, cwd: Path) -> str:
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def test_the_readme_testing_example_runs_on_a_manual_clock(tmp_path: Path) -> None:
    code = block(
        ROOT / "README.md", "import oncewire\nfrom oncewire.errors import EffectNotFound\n"
    )
    assert run_python(code, tmp_path).splitlines() == ["1 done", "effect_not_found"]


def test_the_replies_program_runs(tmp_path: Path) -> None:
    first = "import oncewire\nfrom oncewire.replies import TELEGRAM_LIKE, Delivered\n\n\nclass"
    code = block(ROOT / "docs" / "replies.md", first)
    assert run_python(code, tmp_path).strip() == "{'1': 'you said: hi'}"
    with closing(sqlite3.connect(tmp_path / "chat.db")) as chat:
        assert chat.execute("SELECT status, attempts FROM oncewire_inbound").fetchall() == [
            ("delivered", 1)
        ]
    # Run again: the message is a re-delivery, answered once already: nothing is sent.
    assert run_python(code, tmp_path).strip() == "{}"


def test_the_documented_schema_url_selects_the_schema(tmp_path: Path) -> None:
    import psycopg

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    postgres_doc = (ROOT / "docs" / "postgres.md").read_text(encoding="utf-8")
    form = "postgresql://host/db?options=-csearch_path%3Dmyschema"
    assert form in readme
    assert "?options=-csearch_path%3Dmyschema" in postgres_doc
    server = urlsplit(server_url())
    schema = f"oncewire_docs_{uuid.uuid4().hex[:10]}"
    url = form.replace("host/db", f"{server.netloc}{server.path}").replace("myschema", schema)
    with psycopg.connect(server_url(), autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")  # type: ignore[arg-type]
        try:
            run_python(
                "import oncewire\n"
                f"with oncewire.Ledger({url!r}) as ledger:\n"
                "    ledger.accept('k', 'mail', {})\n",
                tmp_path,
            )
            rows = admin.execute(
                "SELECT table_schema FROM information_schema.tables "
                "WHERE table_name = 'oncewire_effects' AND table_schema = %s",
                (schema,),
            ).fetchall()
            assert rows == [(schema,)]
            count = admin.execute(f"SELECT COUNT(*) FROM {schema}.oncewire_effects").fetchone()  # type: ignore[arg-type]
            assert count == (1,)
            doctor = subprocess.run(
                [sys.executable, "-m", "oncewire", "doctor", "--db", url],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert doctor.returncode == 0, doctor.stdout + doctor.stderr
            assert f"({schema})" in doctor.stdout
            # What the docs say about the bare "=": libpq refuses it in a URL.
            bare = url.replace("%3D", "=")
            refused = subprocess.run(
                [sys.executable, "-m", "oncewire", "effects", "list", "--db", bare],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert refused.returncode == 1
            assert "extra key/value separator" in refused.stderr
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["cli.md", "receivers.md"])
def test_the_readme_links_the_new_docs(name: str) -> None:
    assert f"(docs/{name})" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert (ROOT / "docs" / name).is_file()
