"""The tool ``terminal`` the seed's model calls (H6): runs ``{"command": ...}`` with ``sh -c``
and answers what it printed. A sink of the gateway's dispatcher, imported by the gateway
process from ``[[tools]] sink``."""

from __future__ import annotations

import subprocess
from typing import Any


def terminal(attempt: Any) -> dict[str, Any]:
    done = subprocess.run(
        ["sh", "-c", str(attempt.payload["command"])],
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )
    return {"exit_code": done.returncode, "output": done.stdout}
