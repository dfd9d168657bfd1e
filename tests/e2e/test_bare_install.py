"""``pip install oncewire`` with no extra: the command line and the core library work, and
whatever needs an extra says which one, in one line, without a traceback.

Every other test runs on a full install (``make`` installs every extra), so nothing else would
notice a module of the bare package that imports an optional dependency. This test installs the
package from this checkout into a new virtual environment with its required dependencies only
(``pip install <sources>``, no extra) and runs everything there, as a user would. It is one
test function so that pytest-xdist runs it, and builds the environment, once.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path

import click
import pytest

from oncewire.cli import cli

ROOT = Path(__file__).resolve().parents[2]
# The optional dependencies of every extra (pyproject.toml): none may be importable there.
OPTIONAL = (
    "httpx2",
    "starlette",
    "uvicorn",
    "websockets",
    "jinja2",
    "psycopg",
    "nats",
    "langgraph",
    "langchain_core",
    "mcp",
    "agents",
    "openai",
)
OPTIONAL_OTEL = "opentelemetry"


def _command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, command in sorted(group.commands.items()):
        found.append((*prefix, name))
        if isinstance(command, click.Group):
            found += _command_paths(command, (*prefix, name))
    return found


def _copy_sources(target: Path) -> Path:
    """What ``pip install <checkout>`` reads, copied, so that the build's ``build/`` and
    ``*.egg-info`` land in the copy and a stale ``build/lib`` can never be installed."""
    target.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, target / name)
    shutil.copytree(
        ROOT / "src",
        target / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"),
    )
    return target


def _bare_venv(folder: Path) -> Path:
    """A new virtual environment with oncewire installed without extras; its bin folder."""
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    sources = _copy_sources(folder / "sources")
    # This environment's pip installs into the new one (--python): the package is built from
    # the copied sources and its required dependencies come from the index, as for a user.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            str(sources),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return venv / "bin"


class Bare:
    def __init__(self, bin_dir: Path, cwd: Path) -> None:
        self.bin = bin_dir
        self.cwd = cwd
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("ONCEWIRE_", "PYTHON", "VIRTUAL_ENV"))
        }
        self.env["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "oncewire"), *args],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "python"), "-c", code],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )


def _needs_extra(result: subprocess.CompletedProcess[str], extra: str) -> list[str]:
    """What is wrong with a command's answer that should say it needs ``extra``."""
    problems = []
    lines = result.stderr.splitlines()
    if result.returncode == 0:
        problems.append("exited 0")
    if len(lines) != 1 or f"'{extra}' extra" not in lines[0]:
        problems.append(f"not one line naming the {extra!r} extra: {result.stderr!r}")
    if "Traceback" in result.stdout + result.stderr:
        problems.append("a traceback")
    return problems


LIBRARY = textwrap.dedent(
    """
    import importlib, json, pkgutil, sqlite3, sys

    import oncewire
    import oncewire.sinks
    from oncewire.errors import MissingExtra

    seen = {}
    for name in oncewire.__all__:
        getattr(oncewire, name)
    for name in ("ReceiptsSink", "SubprocessSink"):
        getattr(oncewire.sinks, name)

    # The core library on a real file: accept, dispatch to a callable sink, a receipt.
    db = sys.argv[1]
    with oncewire.Ledger(db) as ledger:
        with ledger.transaction() as tx:
            tx.accept("bare-1", "note", {"n": 1})
        oncewire.Dispatcher(
            ledger, sinks={"note": lambda attempt: oncewire.Done({"seen": attempt.payload})}
        ).run(until_idle=True, handle_signals=False)
    with oncewire.Receipts(db) as receipts:
        receipts.run_once("req-1", {"n": 1}, lambda tx: {"ticket": 1})
    seen["core"] = "ok"

    def refusal(what, call):
        try:
            call()
        except MissingExtra as exc:
            seen[what] = {"extra": exc.extra, "message": str(exc)}
        except Exception as exc:
            seen[what] = {"other": f"{type(exc).__name__}: {exc}"}
        else:
            seen[what] = {"other": "no error"}

    refusal("HttpSink", lambda: oncewire.sinks.HttpSink("http://127.0.0.1:9/"))
    refusal("NatsJetStreamSink", lambda: oncewire.sinks.NatsJetStreamSink("orders"))
    refusal("Ledger(postgresql)", lambda: oncewire.Ledger("postgresql://127.0.0.1:9/none"))
    refusal("oncewire.otel", lambda: importlib.import_module("oncewire.otel"))
    refusal("oncewire.gateway.runner", lambda: importlib.import_module("oncewire.gateway.runner"))
    refusal("oncewire.ui.server", lambda: importlib.import_module("oncewire.ui.server"))
    # oncewire.langgraph imports; its node needs the extra, current_attempt does not.
    import oncewire.langgraph
    refusal("DurableToolNode", lambda: oncewire.langgraph.DurableToolNode)
    try:
        oncewire.langgraph.current_attempt()
    except oncewire.errors.InvalidState:
        seen["current_attempt"] = "ok"
    refusal("oncewire.langgraph.OncewireSaver", lambda: oncewire.langgraph.OncewireSaver)
    import oncewire.agents
    refusal("oncewire.agents.OncewireSession", lambda: oncewire.agents.OncewireSession)
    # oncewire.mcp imports (its protocol names need nothing); what needs the SDK says so.
    import oncewire.mcp
    seen["mcp key"] = oncewire.mcp.IDEMPOTENCY_KEY
    refusal("oncewire.mcp.once", lambda: oncewire.mcp.once)
    refusal("oncewire.mcp.Proxy", lambda: oncewire.mcp.Proxy)

    # Every module of the package either imports or says which extra it needs (a __main__
    # would run its command).
    others = {}
    for module in pkgutil.walk_packages(oncewire.__path__, "oncewire."):
        if module.name.endswith(".__main__"):
            continue
        try:
            importlib.import_module(module.name)
        except MissingExtra:
            pass
        except BaseException as exc:
            others[module.name] = f"{type(exc).__name__}: {exc}"
    seen["modules"] = others
    print(json.dumps(seen))
    """
)


@pytest.mark.timeout(600)
def test_the_package_without_extras(tmp_path: Path) -> None:
    bare = Bare(_bare_venv(tmp_path), tmp_path)

    # Nothing optional is installed there.
    found = bare.python(
        "import importlib.util, json; "
        f"print(json.dumps([n for n in {(*OPTIONAL, OPTIONAL_OTEL)!r} "
        "if importlib.util.find_spec(n)]))"
    )
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == []

    # Help: the console script for the top level and each noun group, then every command's.
    top = bare.run("--help")
    assert top.returncode == 0, top.stderr
    assert top.stderr == ""
    for name in sorted(cli.commands):
        assert name in top.stdout
        result = bare.run(name, "--help")
        assert (result.returncode, result.stderr) == (0, ""), (name, result.stderr)
        assert "Usage: oncewire" in result.stdout
    paths = _command_paths(cli)
    helped = bare.python(
        "import json, sys\n"
        "from oncewire.cli import main\n"
        "codes = {}\n"
        f"for path in {paths!r}:\n"
        "    codes[' '.join(path)] = main([*path, '--help'])\n"
        "print(json.dumps(codes))\n"
    )
    assert helped.returncode == 0, helped.stderr
    codes = json.loads(helped.stdout.strip().splitlines()[-1])
    assert codes == {" ".join(p): 0 for p in paths}

    # The library.
    library = bare.python(LIBRARY.replace("sys.argv[1]", repr(str(tmp_path / "library.db"))))
    assert library.returncode == 0, library.stderr
    seen = json.loads(library.stdout.strip().splitlines()[-1])
    assert seen.pop("core") == "ok"
    assert seen.pop("modules") == {}
    assert seen.pop("current_attempt") == "ok"
    assert seen.pop("mcp key") == "io.oncewire/idempotency-key"
    expected = {
        "HttpSink": "http",
        "NatsJetStreamSink": "nats",
        "Ledger(postgresql)": "postgres",
        "oncewire.otel": "otel",
        "oncewire.gateway.runner": "gateway",
        "oncewire.ui.server": "ui",
        "DurableToolNode": "langgraph",
        "oncewire.langgraph.OncewireSaver": "langgraph",
        "oncewire.agents.OncewireSession": "agents",
        "oncewire.mcp.once": "mcp",
        "oncewire.mcp.Proxy": "mcp",
    }
    assert {what: refused.get("extra") for what, refused in seen.items()} == expected, seen
    for what, refused in seen.items():
        extra = expected[what]
        assert f"needs the '{extra}' extra: pip install 'oncewire[{extra}]'" in refused["message"]
    with closing(sqlite3.connect(tmp_path / "library.db")) as conn:
        assert conn.execute("SELECT key, state FROM oncewire_effects").fetchall() == [
            ("bare-1", "done")
        ]
        assert conn.execute("SELECT count(*) FROM oncewire_receipts").fetchone() == (1,)

    # effects accept into a new SQLite file, read back with sqlite3.
    store = tmp_path / "new" / "app.db"
    store.parent.mkdir()
    accepted = bare.run("effects", "accept", "--db", str(store), "k-1", "mail", '{"to": "zoë"}')
    assert accepted.returncode == 0, accepted.stderr
    with closing(sqlite3.connect(store)) as conn:
        stored = conn.execute("SELECT key, kind, state, payload FROM oncewire_effects").fetchall()
    assert stored == [("k-1", "mail", "pending", '{"to":"zoë"}')]
    status = bare.run("gateway", "status", "--db", str(store), "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout) == {"sessions": []}

    # The crash lab: the outbox suite runs and passes. The gateway suite is not applicable:
    # each of its scenarios says why, and the run passes (plain `oncewire lab` runs every suite,
    # this one among them, for minutes: the other suites need no extra).
    outbox = bare.run("lab", "--suite", "outbox", "--quiet")
    assert outbox.returncode == 0, outbox.stdout + outbox.stderr
    assert outbox.stdout.strip().splitlines()[-1].startswith("PASS: 5 scenarios in 1 suite(s)")
    gateway = bare.run("lab", "--suite", "gateway", "--json", "--quiet")
    assert gateway.returncode == 0, gateway.stdout + gateway.stderr
    evidence = json.loads(gateway.stdout)
    assert evidence["passed"] is True
    scenarios = evidence["suites"]["gateway"]["scenarios"]
    assert scenarios
    for scenario in scenarios.values():
        assert "needs the 'gateway' extra" in (scenario["skipped"] or ""), scenario
    table = bare.run("lab", "--suite", "gateway", "--quiet")
    assert table.returncode == 0
    assert table.stdout.splitlines()[-1].startswith(
        f"PASS: 0 scenarios in 1 suite(s), {len(scenarios)} not applicable"
    )
    langgraph = bare.run("lab", "--suite", "langgraph", "--json", "--quiet")
    assert langgraph.returncode == 0, langgraph.stdout + langgraph.stderr
    evidence = json.loads(langgraph.stdout)
    assert evidence["passed"] is True
    [only] = evidence["suites"]["langgraph"]["scenarios"].values()
    assert "needs the 'langgraph' extra" in (only["skipped"] or ""), only
    mcp = bare.run("lab", "--suite", "mcp", "--json", "--quiet")
    assert mcp.returncode == 0, mcp.stdout + mcp.stderr
    evidence = json.loads(mcp.stdout)
    assert evidence["passed"] is True
    [only] = evidence["suites"]["mcp"]["scenarios"].values()
    assert "needs the 'mcp' extra" in (only["skipped"] or ""), only
    agents = bare.run("lab", "--suite", "agents", "--json", "--quiet")
    assert agents.returncode == 0, agents.stdout + agents.stderr
    [only] = json.loads(agents.stdout)["suites"]["agents"]["scenarios"].values()
    assert "needs the 'agents' extra" in (only["skipped"] or ""), only

    # What needs an extra says which one, in one line, and exits non-zero.
    config = tmp_path / "gateway.toml"
    config.write_text("")
    problems = {
        "gateway run": _needs_extra(bare.run("gateway", "run", "--config", str(config)), "gateway"),
        "gateway webhook set": _needs_extra(
            bare.run("gateway", "webhook", "set", "--config", str(config)), "gateway"
        ),
        "gateway demo": _needs_extra(bare.run("gateway", "demo"), "gateway"),
        "ui": _needs_extra(bare.run("ui", "--db", str(store)), "ui"),
        "langgraph pending": _needs_extra(
            bare.run("langgraph", "pending", "--db", str(store)), "langgraph"
        ),
        "langgraph resume": _needs_extra(
            bare.run("langgraph", "resume", "--db", str(store), "--all", "--yes"), "langgraph"
        ),
        "effects list --db postgresql://": _needs_extra(
            bare.run("effects", "list", "--db", "postgresql://127.0.0.1:9/none"), "postgres"
        ),
        "mcp proxy": _needs_extra(
            bare.run("mcp", "proxy", "--db", str(store), "--", "python", "-c", "pass"), "mcp"
        ),
        "mcp proxy --listen": _needs_extra(
            bare.run("mcp", "proxy", "--db", str(store), "--listen", "8765", "--", "true"), "mcp"
        ),
        "lab --backend postgresql": _needs_extra(
            bare.run(
                "lab", "--suite", "outbox", "--backend", "postgresql", "--db", "postgresql:///x"
            ),
            "postgres",
        ),
    }
    assert {what: found for what, found in problems.items() if found} == {}


REFUSED = textwrap.dedent(
    """
    import importlib.abc, json, sys

    OPTIONAL = ("httpx2", "httpx", "starlette", "uvicorn", "websockets", "jinja2", "markupsafe",
                "opentelemetry", "nats", "langgraph", "langchain_core", "mcp", "agents",
                "psycopg", "fastapi")

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in OPTIONAL:
                raise ImportError(f"{name} is not installed")

    sys.meta_path.insert(0, Refuse())
    from oncewire.cli import main

    codes = [main(["--help"]), main(["effects", "accept", "--db", sys.argv[1], "k", "mail", "{}"])]
    codes.append(main(["gateway", "webhook", "delete", "--config", sys.argv[2]]))
    print(json.dumps(codes))
    """
)


def test_the_cli_starts_with_every_optional_import_refused(tmp_path: Path) -> None:
    # Installed but not importable (a finder that raises, as a broken or blocked install does):
    # the command line still starts and says which extra a command needs.
    db, config = tmp_path / "app.db", tmp_path / "gateway.toml"
    config.write_text("")
    ran = subprocess.run(
        [sys.executable, "-c", REFUSED, str(db), str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == [0, 0, 1]
    assert ran.stderr.splitlines() == [
        "error: oncewire's gateway needs the 'gateway' extra: pip install 'oncewire[gateway]' "
        "(httpx2, starlette, uvicorn, websockets not installed) [missing_extra]"
    ]
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT key, kind FROM oncewire_effects").fetchall() == [("k", "mail")]
