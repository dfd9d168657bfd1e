"""lab: real processes, real SIGKILL, invariants read from the stores.

:mod:`oncewire.lab.framework` is the machinery, :mod:`oncewire.lab.fixtures` what the suites
share, :mod:`oncewire.lab.suites` the suites (``SUITES``, the one list) and
:mod:`oncewire.lab.children` the child processes they kill; ``oncewire lab`` runs them.
"""

from oncewire.lab.framework import LabContext, ProcessRecord, ScenarioResult, Suite

__all__ = ["LabContext", "ProcessRecord", "ScenarioResult", "Suite"]
