"""lab: real processes, real SIGKILL, invariants read from the stores.

:mod:`oncewire.lab.framework` is the machinery, :mod:`oncewire.lab.fixtures` what the suites
share, :mod:`oncewire.lab.suites` the suites (``SUITES``, the one list) and
:mod:`oncewire.lab.children` the child processes they kill; ``oncewire lab`` runs them.

The framework's names load on first use (PEP 562): every child process imports this package
on its way to :mod:`oncewire.lab.children`, and needs none of the machinery that starts it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oncewire.lab.framework import LabContext, ProcessRecord, ScenarioResult, Suite

__all__ = ["LabContext", "ProcessRecord", "ScenarioResult", "Suite"]

if not TYPE_CHECKING:  # a type checker keeps reporting unknown names as errors

    def __getattr__(name: str) -> object:
        if name not in __all__:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module("oncewire.lab.framework"), name)
        globals()[name] = value  # the next lookup is a plain module attribute
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))
