"""``oncewire --help`` lists every noun with its command's own first sentence, without importing
the nouns' modules (each pulls in the part of oncewire it drives: the gateway, the lab, a
framework), and prints exactly what it would print with all of them imported."""

from __future__ import annotations

import json
import subprocess
import sys

import click

from oncewire.cli import _COMMANDS, cli


def _help(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout


def test_each_listed_summary_is_the_commands_own() -> None:
    for name, (_, _, summary) in _COMMANDS.items():
        command = cli.commands[name]
        listed = click.Command(name, help=summary)
        assert listed.get_short_help_str(1_000) == command.get_short_help_str(1_000), name


LAZY = """
import contextlib, io, json, sys
from oncewire.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(["--help"])
print(json.dumps({"code": code, "text": out.getvalue(),
                  "loaded": sorted(m for m in sys.modules if m.startswith("oncewire.cli."))}))
"""

EAGER = """
import contextlib, io, sys
from oncewire.cli import _COMMANDS, cli, main
for name in _COMMANDS:
    cli.commands[name]  # import every noun first: the listing click would make itself
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(["--help"])
sys.stdout.write(out.getvalue())
"""


def test_the_help_imports_no_noun_and_reads_as_if_all_were_imported() -> None:
    lazy = json.loads(_help(LAZY))
    assert lazy["code"] == 0
    assert lazy["loaded"] == [], lazy["loaded"]
    assert lazy["text"] == _help(EAGER)
    for name in _COMMANDS:
        assert f"  {name} " in lazy["text"], name
