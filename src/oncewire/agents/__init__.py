"""oncewire for the OpenAI Agents SDK (``pip install 'oncewire[agents]'``).

A run that survives its process: each model response recorded before anything acts on it, each
tool call an effect performed once, and the conversation kept by :class:`OncewireSession` in the
same store.

Importing this package needs no optional dependency; a name that needs ``openai-agents`` imports
it when first used (a :class:`~oncewire.errors.MissingExtra` without the extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oncewire.core import lazy as _lazy

if TYPE_CHECKING:
    from oncewire.agents.session import OncewireSession

__all__ = ["OncewireSession"]

_HOME = {
    "OncewireSession": "oncewire.agents.session",
}

if not TYPE_CHECKING:  # a type checker keeps reporting unknown names as errors
    __getattr__, __dir__ = _lazy.names(globals(), _HOME)
