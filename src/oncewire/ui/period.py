"""How often the dashboard's pages refresh their data: ``--refresh-seconds``, checked before
anything starts. Needs no extra, so the command line can refuse a bad value on its own."""

from __future__ import annotations

import math
import re

from oncewire.core.errors import ConfigurationError

__all__ = ["DEFAULT_SECONDS", "MAX_SECONDS", "MIN_SECONDS", "check", "milliseconds", "parse"]

MIN_SECONDS = 0.1
MAX_SECONDS = 3600.0
DEFAULT_SECONDS = 2.0
_NUMBER = re.compile(r"\+?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", re.ASCII)
_WANTED = f"a number of seconds from {MIN_SECONDS:g} to {MAX_SECONDS:g}"


def check(seconds: float) -> float:
    """``seconds`` if it is a period the dashboard refreshes at, else ConfigurationError."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ConfigurationError(f"the refresh period must be {_WANTED}, not {seconds!r}")
    if not math.isfinite(seconds) or not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise ConfigurationError(f"the refresh period must be {_WANTED}, not {seconds!r}")
    return float(seconds)


def parse(text: str) -> float:
    """``--refresh-seconds TEXT``: a plain decimal number (``nan``, ``inf``, ``1_0`` refused)."""
    if _NUMBER.fullmatch(text.strip()) is None:
        raise ConfigurationError(f"--refresh-seconds must be {_WANTED}, not {text!r}")
    try:
        return check(float(text))
    except ConfigurationError:
        raise ConfigurationError(f"--refresh-seconds must be {_WANTED}, not {text!r}") from None


def milliseconds(seconds: float) -> int:
    """The period as the page's ``data-refresh-ms`` carries it (whole milliseconds)."""
    return round(check(seconds) * 1000)
