"""The command line: a thin client of the public Python API.

Noun groups, then verbs. Every command that opens a store takes ``--db`` (or ``ONCEWIRE_DB``),
readers take ``--json``, destructive commands ask or take ``--yes``. Errors print one line and
exit non-zero; ``-v`` shows the traceback.
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


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="oncewire")
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks and debug logs.")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """oncewire: every accepted action happens once; every unknown is said out loud."""
    ctx.obj = {"verbose": verbose}
    if verbose:
        import logging

        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(message)s")


def _register() -> None:
    from oncewire.cli import dispatch, doctor, effects, lab, receipts, replies, runs

    cli.add_command(effects.group)
    cli.add_command(receipts.group)
    cli.add_command(dispatch.command)
    cli.add_command(doctor.command)
    cli.add_command(lab.command)
    cli.add_command(runs.group)
    cli.add_command(replies.inbound_group)
    cli.add_command(replies.replies_group)


_register()


def main(argv: list[str] | None = None) -> int:
    verbose = "-v" in (argv or sys.argv[1:]) or "--verbose" in (argv or sys.argv[1:])
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
        if verbose:
            traceback.print_exc()
        click.echo(f"error: {exc} [{exc.code}]", err=True)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except click.exceptions.Exit as exc:
        return exc.exit_code
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
