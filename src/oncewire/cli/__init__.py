"""The command line: a thin client of the public Python API.

Noun groups, then verbs. Every command that opens a store takes ``--db`` (or ``ONCEWIRE_DB``),
readers take ``--json``, destructive commands ask or take ``--yes``. Errors print one line and
exit non-zero; ``-v`` (anywhere on the line) shows the traceback.
"""

from __future__ import annotations

import sys
import traceback

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


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="oncewire")
def cli() -> None:
    """oncewire: every accepted action happens once; every unknown is said out loud."""


def _register() -> None:
    from oncewire.cli import (
        dispatch,
        doctor,
        effects,
        gateway,
        lab,
        langgraph,
        mcp,
        receipts,
        replies,
        runs,
        ui,
    )

    cli.add_command(effects.group)
    cli.add_command(receipts.group)
    cli.add_command(dispatch.command)
    cli.add_command(doctor.command)
    cli.add_command(lab.command)
    cli.add_command(runs.group)
    cli.add_command(replies.inbound_group)
    cli.add_command(replies.replies_group)
    cli.add_command(gateway.group)
    cli.add_command(ui.command)
    cli.add_command(langgraph.group)
    cli.add_command(mcp.group)

    def add_verbose(command: click.Command) -> None:
        # Every command and group takes -v, so `oncewire effects list -v` works as well as
        # `oncewire -v effects list`.
        command.params.append(_verbose_option())
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                add_verbose(sub)

    add_verbose(cli)


_register()


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
