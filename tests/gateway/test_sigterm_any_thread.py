"""``oncewire gateway run`` drains on a SIGTERM whichever of its threads the kernel hands it to.

A signal sent to a process goes to any of its threads that does not block it; Python runs the
handler (the drain) only in the main thread, once that thread runs bytecode again. A main
thread in an untimed wait never did: the gateway ignored SIGTERM, and was killed at the end of
its supervisor's patience. Here the signal is sent to each of its other threads in turn
(``tgkill``, a real thread-directed signal) and the gateway must stop, cleanly, every time."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.gateway.push_rig import PushRig, by_token

SYS_TGKILL = 234  # x86_64


def tgkill(pid: int, tid: int, sig: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="tgkill's number is x86_64's")
def test_a_sigterm_handed_to_another_thread_drains_the_gateway(tmp_path: Path) -> None:
    rig = PushRig(tmp_path, by_token({}), str(tmp_path / "gateway.db"))
    try:
        gateway = rig.start()
        pid = gateway.process.pid
        others = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
        assert others, "the gateway runs its work on threads of its own"
        tgkill(pid, others[0], signal.SIGTERM)
        try:
            code = gateway.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            gateway.kill()
            raise AssertionError(
                f"SIGTERM on thread {others[0]} did not drain it\n{gateway.log_text()}"
            ) from None
        assert code == 0, gateway.log_text()
        assert "gateway stopped" in gateway.log_text()
    finally:
        rig.stop()
