"""No import circle between the modules of the packages where one was found and broken.

A circle makes "which module stands on which" a question with no answer: the run machinery
imported the presets built on it (thirteen modules of oncewire.runs in one circle), and each
backend's driver and its inspection imported each other. Imports under TYPE_CHECKING are left
out: they do not run.
"""

from __future__ import annotations

import sys

import grimp
import pytest

# Each with every package below it.
PACKAGES = ("oncewire.runs", "oncewire.storage", "oncewire.gateway")


def circles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """The strongly connected components of more than one module among ``package``'s."""
    nodes = {package} | set(graph.find_descendants(package))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in nodes:
                continue
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(nodes)))
    try:
        for module in sorted(nodes):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("oncewire", exclude_type_checking_imports=True, cache_dir=None)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_of_the_package_imports_itself_round_a_circle(
    graph: grimp.ImportGraph, package: str
) -> None:
    assert circles(graph, package) == []


def test_the_check_finds_a_circle_and_only_the_circle() -> None:
    made = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d"):
        made.add_module(module)
    made.add_import(importer="pkg.a", imported="pkg.b")
    made.add_import(importer="pkg.b", imported="pkg.c")
    made.add_import(importer="pkg.c", imported="pkg.a")
    made.add_import(importer="pkg.d", imported="pkg.a")
    assert circles(made, "pkg") == [["pkg.a", "pkg.b", "pkg.c"]]
