"""Identifiers and the identity of this process."""

from __future__ import annotations

import os

__all__ = ["new_id", "owner_is_dead_locally", "process_start_ticks", "this_process_owner"]


def new_id() -> str:
    """A random version-4 UUID as 32 hex digits."""
    import uuid  # here: most processes never need one, and the module pulls in platform

    return uuid.uuid4().hex


def _hostname() -> str:
    return os.uname().nodename  # what socket.gethostname() returns, without loading socket


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of ``pid`` on Linux, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode("ascii", "replace")
    except OSError:
        return None
    # Field 2 (comm) may contain spaces and parentheses; fields after the last ')' are fixed.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])  # fields 3 and 22 overall: state, starttime
    except (IndexError, ValueError):
        return None


def process_start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), or None if unknown/absent.

    A pid alone is not an identity: pids are reused. pid + start time is.
    """
    stat = _proc_stat(pid)
    return None if stat is None else stat[1]


def this_process_owner() -> str:
    """``host:pid:start_ticks:nonce`` - enough for a peer on the same host to tell we died."""
    pid = os.getpid()
    return f"{_hostname()}:{pid}:{process_start_ticks(pid) or 0}:{os.urandom(4).hex()}"


def owner_is_dead_locally(owner: str) -> bool:
    """True only when ``owner`` is a process on this host that is certainly gone."""
    parts = owner.split(":")
    if len(parts) != 4 or parts[0] != _hostname():
        return False
    try:
        pid, ticks = int(parts[1]), int(parts[2])
    except ValueError:
        return False
    if ticks == 0:
        return False  # we never knew its start time; cannot tell reuse from life
    stat = _proc_stat(pid)
    # A zombie (Z) or dying (X) process has exited; only its parent has not reaped it yet.
    return stat is None or stat[1] != ticks or stat[0] in ("Z", "X")
