"""Reading a caller's state filter: one enum member, its value, or a sequence of either.

Every ledger's ``list(state=...)`` takes the same shapes and refuses an unknown state the same
way: a :class:`ConfigurationError` naming the allowed values, before any SQL.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import Enum
from typing import TypeVar

from oncewire.core.errors import ConfigurationError

__all__ = ["coerce_state", "coerce_states"]

E = TypeVar("E", bound=Enum)


def coerce_state(enum: type[E], value: E | str) -> E:
    """``value`` as a member of ``enum``; :class:`ConfigurationError` naming the allowed values."""
    try:
        return enum(value)
    except ValueError:
        names = ", ".join(str(member.value) for member in enum)
        label = re.sub(r"(?<!^)(?=[A-Z])", " ", enum.__name__).lower()  # EffectState: effect state
        raise ConfigurationError(
            f"unknown {label} {value!r} (one of: {names})", value=str(value), allowed=names
        ) from None


def coerce_states(enum: type[E], value: E | str | Sequence[E | str] | None) -> list[E]:
    """The members a filter names: none (no filter) for None, one for a member or a string, in
    order for a sequence."""
    if value is None:
        return []
    if isinstance(value, str | Enum):
        return [coerce_state(enum, value)]
    if not isinstance(value, Sequence):
        raise ConfigurationError(
            f"a state filter ({enum.__name__}) is a state, a sequence of them or None, "
            f"not {value!r}"
        )
    return [coerce_state(enum, item) for item in value]
