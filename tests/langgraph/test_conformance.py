"""langgraph-checkpoint-conformance against OncewireSaver, on SQLite and PostgreSQL: level FULL,
every capability (the extended ones too) detected and passing. The report is printed (pytest
-s shows it) and a failure names every failing test of the suite."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

conformance = pytest.importorskip(
    "langgraph.checkpoint.conformance",
    reason="langgraph-checkpoint-conformance is not installed (the dev install brings it)",
)

from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES  # noqa: E402

from oncewire.langgraph import OncewireSaver  # noqa: E402


def test_oncewire_saver_passes_the_conformance_suite_in_full(db_url: str) -> None:
    async def factory() -> AsyncIterator[OncewireSaver]:
        with OncewireSaver.from_conn_string(db_url) as saver:
            yield saver

    backend = "postgresql" if db_url.startswith("postgresql") else "sqlite"
    registered = conformance.checkpointer_test(name=f"OncewireSaver ({backend})")(factory)
    report = asyncio.run(conformance.validate(registered))
    report.print_report()
    failures = [f for r in report.results.values() for f in r.failures]
    assert failures == []
    assert {c.value for c in ALL_CAPABILITIES} == {
        name for name, r in report.results.items() if r.detected and r.passed is True
    }
    assert report.conformance_level() == "FULL"
