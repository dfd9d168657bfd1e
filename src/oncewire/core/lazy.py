"""Names a package loads on first use (PEP 562), one implementation for every package that does.

``__getattr__, __dir__ = lazy.names(globals(), {"Name": "package.module", ...})`` at the
bottom of a package's ``__init__``: ``package.Name`` imports its module when first asked for
and keeps the value as a plain module attribute, so the next lookup costs nothing.
``unknown(name)`` (raising an ``AttributeError`` that says more) is called for a name the
package does not have.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

__all__ = ["names"]


def names(
    namespace: dict[str, Any],
    homes: Mapping[str, str],
    unknown: Callable[[str], NoReturn] | None = None,
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the package whose globals are ``namespace``."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            if unknown is not None:
                unknown(name)
            raise AttributeError(f"module {package!r} has no attribute {name!r}", name=name)
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value  # the next lookup is a plain module attribute
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace["__all__"]))

    return __getattr__, __dir__
