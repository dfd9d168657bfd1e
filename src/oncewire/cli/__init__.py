"""The command line: a thin client of the public Python API.

Noun groups, then verbs. Every command that opens a store takes ``--db`` (or ``ONCEWIRE_DB``),
readers take ``--json``, destructive commands ask or take ``--yes``. Errors print one line and
exit non-zero; ``-v`` (anywhere on the line) shows the traceback.

A noun's module is imported when its command is first looked up, so ``oncewire mcp proxy`` (a
child process that tools start often) does not import the gateway's or the lab's.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Iterator, MutableMapping

import click

from oncewire import __version__
from oncewire.core.errors import OncewireError

__all__ = ["cli", "main"]

EXIT_ERROR = 1
EXIT_USAGE = 2
VERBOSE_HELP = "Show tracebacks and debug logs."

_verbose = False  # set while parsing, wherever -v stands on the line


def _set_verbose(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    global _verbose
    if value and not _verbose:
        _verbose = True
        import logging

        from oncewire.cli.common import configure_logging

        configure_logging(logging.DEBUG)


def _verbose_option() -> click.Option:
    return click.Option(
        ["-v", "--verbose"],
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_set_verbose,
        help=VERBOSE_HELP,
    )


# A top-level command's name: the module under oncewire.cli that defines it, its name there, and
# the first sentence of its help, which ``oncewire --help`` lists without importing the module
# (tests/e2e/test_cli_help.py holds each to the command's own).
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "effects": ("effects", "group", "Accepted intents: list, show, accept, cancel, retry."),
    "receipts": ("receipts", "group", "A receiver's receipts: list, show, purge."),
    "dispatch": (
        "dispatch",
        "command",
        "Run dispatchers: claim due effects, call the app's sinks, record their outcomes.",
    ),
    "doctor": (
        "doctor",
        "command",
        "Check the store: access, integrity, schema, settings, clock skew and work that waits.",
    ),
    "lab": (
        "lab",
        "command",
        "Run the crash lab: real child processes, real SIGKILL, invariants read from the stores.",
    ),
    "runs": ("runs", "group", "Run ledgers: list, show, verify, reconcile, adopt-key, reports."),
    "inbound": ("replies", "inbound_group", "Inbound chat messages, admitted once: list, show."),
    "replies": (
        "replies",
        "replies_group",
        "Reply records and their wire operations: list, show, counts.",
    ),
    "gateway": (
        "gateway",
        "group",
        "The chat gateway: check its configuration and what it connects to, and switch a "
        "Telegram bot to webhook mode.",
    ),
    "ui": (
        "ui",
        "command",
        "Serve a dashboard of the store: effects, receipts, chats, runs and lab evidence.",
    ),
    "langgraph": ("langgraph", "group", "LangGraph runs (the langgraph extra): pending, resume."),
    "mcp": ("mcp", "group", "The Model Context Protocol (the mcp extra): proxy."),
}


def _add_verbose(command: click.Command) -> None:
    # Every command and group takes -v, so `oncewire effects list -v` works as well as
    # `oncewire -v effects list`.
    command.params.append(_verbose_option())
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_verbose(sub)


class _Nouns(MutableMapping[str, click.Command]):
    """The top-level commands: one is imported when it is looked up by name, all of them when
    the set is read (``--help``, ``cli.commands`` listed)."""

    def __init__(self) -> None:
        self._loaded: dict[str, click.Command] = {}

    def _load(self, name: str) -> None:
        if name in _COMMANDS and name not in self._loaded:
            module, attr, _ = _COMMANDS[name]
            command: click.Command = getattr(
                importlib.import_module(f"oncewire.cli.{module}"), attr
            )
            _add_verbose(command)
            self._loaded[name] = command

    def loaded(self) -> dict[str, click.Command]:
        """The commands imported so far (or added), by name."""
        return self._loaded

    def __getitem__(self, name: str) -> click.Command:
        self._load(name)
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        for name in _COMMANDS:
            self._load(name)
        return iter(dict(self._loaded))

    def __len__(self) -> int:
        return len(set(self._loaded) | set(_COMMANDS))


class _Cli(click.Group):
    """The top-level group: its help lists the nouns from :data:`_COMMANDS` without importing
    them (each pulls in the part of oncewire it drives: the gateway, the lab, a framework)."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        nouns: _Nouns = self.commands  # type: ignore[assignment]
        names = sorted(set(_COMMANDS) | set(nouns.loaded()))
        width = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            loaded = nouns.loaded().get(name)
            if loaded is not None:
                if not loaded.hidden:
                    rows.append((name, loaded.get_short_help_str(width)))
            else:  # shortened as click shortens a command's own help
                summary = click.Command(name, help=_COMMANDS[name][2])
                rows.append((name, summary.get_short_help_str(width)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=_Cli,
    commands=_Nouns(),
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, "--version", prog_name="oncewire")
def cli() -> None:
    """oncewire: every accepted action happens once; every unknown is said out loud."""


cli.params.append(_verbose_option())


def main(argv: list[str] | None = None) -> int:
    global _verbose
    _verbose = False
    try:
        # Without standalone mode click returns a command's Exit code instead of exiting.
        code = cli.main(args=argv, prog_name="oncewire", standalone_mode=False)
        if isinstance(code, int):
            return code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return EXIT_ERROR
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except OncewireError as exc:
        if _verbose:
            traceback.print_exc()
        click.echo(f"error: {exc} [{exc.code}]", err=True)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except Exception as exc:
        # Not one of ours (a bug, or a driver error that escaped translation): still one line,
        # with the traceback only when asked for.
        if _verbose:
            traceback.print_exc()
        click.echo(f"error: {type(exc).__name__}: {exc} (run with -v for the traceback)", err=True)
        return EXIT_ERROR
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
