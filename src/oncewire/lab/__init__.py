"""lab: real processes, real SIGKILL, invariants read from the stores.

:mod:`oncewire.lab.framework` is the machinery, :mod:`oncewire.lab.fixtures` what the suites
share, :mod:`oncewire.lab.suites` the suites (``SUITES``, the one list) and
:mod:`oncewire.lab.children` the child processes they kill; ``oncewire lab`` runs them.

The framework's names load on first use (PEP 562): every child process imports this package
on its way to :mod:`oncewire.lab.children`, and needs none of the machinery that starts it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oncewire.core import lazy as _lazy

if TYPE_CHECKING:
    from oncewire.lab.framework import LabContext, ProcessRecord, ScenarioResult, Suite

__all__ = ["LabContext", "ProcessRecord", "ScenarioResult", "Suite"]

if not TYPE_CHECKING:  # a type checker keeps reporting unknown names as errors
    __getattr__, __dir__ = _lazy.names(globals(), dict.fromkeys(__all__, "oncewire.lab.framework"))
