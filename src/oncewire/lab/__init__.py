"""lab: real processes, real SIGKILL, invariants read from the stores.

Suites register themselves with :func:`oncewire.lab.framework.suite`; ``oncewire lab`` runs them.
"""

from oncewire.lab.framework import (
    LabContext,
    ProcessRecord,
    ScenarioResult,
    Suite,
    suite,
    suites,
)

__all__ = ["LabContext", "ProcessRecord", "ScenarioResult", "Suite", "suite", "suites"]
