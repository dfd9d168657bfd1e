"""Which optional extras are installed, and the one line that says which one is missing.

``pip install oncewire`` installs click and nothing else; each extra brings what one part needs.
A part that needs an extra checks for it where it is used (never at ``import oncewire``), and
says which extra to install, in one line.
"""

from __future__ import annotations

import importlib.util

from oncewire.core.errors import ConfigurationError

__all__ = ["EXTRAS", "MissingExtra", "missing", "require", "unavailable_message"]

# Each extra and the top-level modules it installs (as pyproject.toml's optional-dependencies).
EXTRAS: dict[str, tuple[str, ...]] = {
    "postgres": ("psycopg",),
    "gateway": ("httpx2", "starlette", "uvicorn", "websockets"),
    "http": ("httpx2",),
    "nats": ("nats",),
    "otel": ("opentelemetry",),
    "ui": ("starlette", "uvicorn", "jinja2"),
}


class MissingExtra(ConfigurationError):
    """A part of oncewire was asked for whose optional dependencies are not installed."""

    code = "missing_extra"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that cannot be imported, or a stub
        return False


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (empty: it is installed)."""
    return [name for name in EXTRAS[extra] if not _installed(name)]


def unavailable_message(what: str, extra: str, modules: list[str]) -> str:
    return (
        f"{what} needs the '{extra}' extra: pip install 'oncewire[{extra}]' "
        f"({', '.join(modules)} not installed)"
    )


def require(extra: str, what: str) -> None:
    """Raise :class:`MissingExtra` naming ``extra`` unless all of its modules are installed."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(unavailable_message(what, extra, absent))
