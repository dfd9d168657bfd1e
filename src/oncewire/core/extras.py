"""The optional extras and the modules each brings, for saying which one a feature needs.

``pip install oncewire`` brings click and nothing else: the outbox, the dispatcher, receipts,
the reply and run ledgers, the command line and the crash lab run on SQLite with that. A
feature that needs more says which extra, through :class:`MissingExtra` (a
``ConfigurationError`` and an ``ImportError``): a module that cannot work without its extra
raises it when imported, a class when it is built, a command as its one error line.
"""

from __future__ import annotations

import importlib.util

from oncewire.core.errors import MissingExtra

__all__ = ["EXTRAS", "MissingExtra", "missing", "refusal", "require"]

# Each extra of pyproject.toml and the top-level modules its packages install.
EXTRAS: dict[str, tuple[str, ...]] = {
    "postgres": ("psycopg",),
    "gateway": ("httpx2", "starlette", "uvicorn", "websockets"),
    "http": ("httpx2",),
    "nats": ("nats",),
    "otel": ("opentelemetry",),
    "ui": ("starlette", "uvicorn", "jinja2"),
    "langgraph": ("langgraph", "langchain_core"),
    "mcp": ("mcp",),
}


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a finder that refuses the name: not importable here
        return False


def missing(extra: str, modules: tuple[str, ...] | None = None) -> list[str]:
    """The modules of ``extra`` (or only those of ``modules`` a feature uses) that cannot be
    imported here; empty when all can."""
    names = EXTRAS[extra] if modules is None else modules
    return [name for name in names if not _importable(name)]


def require(extra: str, feature: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise :class:`MissingExtra` when a module ``feature`` needs from ``extra`` is missing."""
    absent = missing(extra, modules)
    if absent:
        raise MissingExtra(feature, extra, absent)


def refusal(extra: str, feature: str, exc: ImportError) -> MissingExtra:
    """The error for a module whose optional import just failed with ``exc``: raise it
    ``from exc`` in the ``except ImportError`` around that import."""
    absent = missing(extra) or [exc.name or str(exc)]
    return MissingExtra(feature, extra, absent)
