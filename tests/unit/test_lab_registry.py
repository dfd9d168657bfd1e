"""The lab's suites are one list: ``SUITES``, in the order ``oncewire lab`` runs them.

The framework imports no suite (a suite imports the framework, never the other way round), and
every suite module in ``oncewire.lab.suites`` is in the list, so none can be silently skipped.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import oncewire.lab.suites
from oncewire.lab.framework import Suite
from oncewire.lab.suites import SUITES, by_name

# ``oncewire lab --suite NAME`` names and the order of a full run: a public interface.
ORDER = (
    "outbox",
    "crashpoints",
    "torture",
    "workers",
    "group",
    "replies",
    "runs",
    "gateway",
    "langgraph",
    "mcp",
    "agents",
)


def test_suites_run_in_the_published_order_under_unique_names() -> None:
    assert tuple(s.name for s in SUITES) == ORDER
    assert list(by_name()) == list(ORDER)
    assert all(isinstance(s, Suite) and s.description for s in SUITES)


def test_every_suite_module_defines_a_suite_that_is_listed() -> None:
    listed = {id(s) for s in SUITES}
    modules = [m.name for m in pkgutil.iter_modules(oncewire.lab.suites.__path__)]
    defining = []
    for name in modules:
        module = importlib.import_module(f"oncewire.lab.suites.{name}")
        suite = getattr(module, "SUITE", None)
        if suite is not None:
            defining.append(name)
            assert id(suite) in listed, f"{name}.SUITE is not in SUITES"
    assert sorted(defining) == sorted(ORDER)


def test_the_framework_and_the_children_import_no_suite() -> None:
    for module in (
        "oncewire.lab.framework",
        "oncewire.lab.fixtures",
        "oncewire.lab.children.effects",
        "oncewire.lab.children.runs",
        "oncewire.lab.children.mcp_client",
    ):
        code = (
            f"import sys, {module}; "
            "print(sorted(m for m in sys.modules if m.startswith('oncewire.lab.suites')))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
        assert out.strip() == "[]", f"{module} imports {out.strip()}"
