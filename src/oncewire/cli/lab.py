"""``oncewire lab``: the crash lab."""

from __future__ import annotations

import json
from pathlib import Path

import click

from oncewire.cli import logformat

__all__ = ["command"]


@click.command("lab")
@click.option(
    "--suite",
    "suite_names",
    multiple=True,
    metavar="NAME",
    help="Run this suite (repeatable; all suites when omitted). See --list.",
)
@click.option("--list", "list_suites", is_flag=True, help="List the suites and exit.")
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write evidence JSON (overwrites).",
)
@click.option(
    "--report",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the report here: a self-contained HTML page with charts when FILE ends "
    "in .html (no script, nothing loaded from elsewhere), else the table as text.",
)
@click.option(
    "--directory",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the stores in this new directory (refused if it exists). Temporary by default.",
)
@click.option("--seed", type=int, default=1, show_default=True, help="Seed for the torture run.")
@click.option("--operations", type=click.IntRange(1), help="Effects in the torture run [400].")
@click.option("--kills", type=click.IntRange(0), help="SIGKILLs in the torture run [8].")
@click.option(
    "--workers",
    type=click.IntRange(1, 16),
    help="Dispatcher processes the torture run keeps busy at once; each kill hits one of them "
    "at random and it is replaced [1].",
)
@click.option(
    "--backend",
    type=click.Choice(["sqlite", "postgresql", "postgres"]),
    default="sqlite",
    show_default=True,
    help="Where the scenario stores live.",
)
@click.option(
    "--db",
    "db_url",
    metavar="URL",
    help="PostgreSQL database for --backend postgresql (each scenario gets its own schemas, "
    "dropped afterwards unless --directory is given).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the evidence JSON on stdout instead of the table (progress stays on stderr).",
)
@click.option(
    "--quiet", "-q", is_flag=True, help="No progress on stderr, only the table (or the JSON)."
)
@logformat.log_format_option
def command(
    suite_names: tuple[str, ...],
    list_suites: bool,
    output: Path | None,
    report: Path | None,
    directory: Path | None,
    seed: int,
    operations: int | None,
    kills: int | None,
    workers: int | None,
    backend: str,
    db_url: str | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Run the crash lab: real child processes, real SIGKILL, invariants read from the stores.

    Progress goes to stderr as the suites run (each scenario's verdict as it finishes; a
    torture run's effects done and kills so far); at the end stdout gets a table of every
    scenario with its verdict and key numbers, then the PASS/FAIL line. Exits 0 when every
    invariant holds, 1 otherwise.
    """
    import os

    from oncewire.lab.fixtures import Backend
    from oncewire.lab.framework import Progress
    from oncewire.lab.report import render_html
    from oncewire.lab.runner import format_report, run_lab
    from oncewire.lab.suites import SUITES

    emit = None
    if logformat.current() == "json":
        import logging

        from oncewire.cli.common import configure_logging

        # Warnings and errors, as Python prints them unconfigured, one JSON object each; the
        # progress lines are INFO records of oncewire.lab with their fields as attributes.
        configure_logging(logging.WARNING)
        progress_log = logging.getLogger("oncewire.lab")
        progress_log.setLevel(logging.INFO)

        def emit(text: str, fields: dict[str, object]) -> None:
            progress_log.info(text.strip(), extra=fields)

    if list_suites:
        for found in SUITES:
            click.echo(f"{found.name:12} {found.description}")
        return
    name = "postgresql" if backend.startswith("postgres") else "sqlite"
    evidence = run_lab(
        suite_names,
        directory=directory,
        seed=seed,
        options={"operations": operations, "kills": kills, "workers": workers},
        backend=Backend(name, db_url, run_id=str(os.getpid())),
        progress=Progress(enabled=not quiet, emit=emit),
    )
    text = format_report(evidence)
    if output is not None:
        output.write_text(json.dumps(evidence, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    if report is not None:
        if report.suffix.lower() in (".html", ".htm"):
            report.write_text(render_html(evidence), encoding="utf-8")
        else:
            report.write_text(text + "\n", encoding="utf-8")
    click.echo(json.dumps(evidence, indent=2) if as_json else text)
    if not evidence["passed"]:
        raise click.exceptions.Exit(1)
