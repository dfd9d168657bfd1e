"""Process identity: a dispatcher may release a peer's claims at once only when that peer is a
process on this host that is certainly gone. Checked against real child processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from oncewire.core.ids import (
    new_id,
    owner_is_dead_locally,
    process_start_ticks,
    this_process_owner,
)

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="process identity needs Linux /proc"
)


def _state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()[0]


def _owner(pid: int, host: str | None = None) -> str:
    ticks = process_start_ticks(pid)
    assert ticks, f"no start time for pid {pid}"
    return f"{host or socket.gethostname()}:{pid}:{ticks}:cafebabe"


@pytest.fixture
def spawn() -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    children: list[subprocess.Popen[bytes]] = []

    def start(code: str) -> subprocess.Popen[bytes]:
        child = subprocess.Popen([sys.executable, "-c", code])
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)


def test_new_ids_are_unique_hex() -> None:
    ids = {new_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_this_process_owner_names_host_pid_start_time_and_a_nonce() -> None:
    owner = this_process_owner()
    host, pid, ticks, nonce = owner.split(":")
    assert host == socket.gethostname()
    assert int(pid) == os.getpid()
    assert int(ticks) == process_start_ticks(os.getpid()) > 0
    assert len(nonce) == 8
    assert this_process_owner() != owner  # two dispatchers in one process are two owners


def test_this_process_is_alive() -> None:
    assert owner_is_dead_locally(this_process_owner()) is False


def test_a_running_child_is_alive(spawn: Callable[[str], subprocess.Popen[bytes]]) -> None:
    child = spawn("import time; time.sleep(60)")
    assert owner_is_dead_locally(_owner(child.pid)) is False


def test_a_child_is_dead_once_exited_even_before_it_is_reaped(
    spawn: Callable[[str], subprocess.Popen[bytes]], wait: Callable[..., None]
) -> None:
    child = spawn("pass")
    owner = _owner(child.pid)
    # Not calling poll()/wait(): the exited child stays a zombie until we reap it.
    wait(lambda: _state(child.pid) == "Z", what="the child to become a zombie")
    assert owner_is_dead_locally(owner) is True
    child.wait(timeout=10)
    assert _state(child.pid) is None or process_start_ticks(child.pid) != int(owner.split(":")[2])
    assert owner_is_dead_locally(owner) is True


def test_a_reused_pid_is_not_mistaken_for_the_owner() -> None:
    pid = os.getpid()
    earlier_owner = f"{socket.gethostname()}:{pid}:{(process_start_ticks(pid) or 2) - 1}:00000000"
    assert owner_is_dead_locally(earlier_owner) is True


def test_an_owner_on_another_host_is_never_judged_dead(
    spawn: Callable[[str], subprocess.Popen[bytes]],
) -> None:
    child = spawn("pass")
    owner = _owner(child.pid, host="another-host.invalid")
    child.wait(timeout=10)
    assert owner_is_dead_locally(owner) is False


def test_a_missing_pid_is_dead() -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert process_start_ticks(pid_max + 1) is None
    assert owner_is_dead_locally(f"{socket.gethostname()}:{pid_max + 1}:12345:00000000") is True


@pytest.mark.parametrize(
    "owner",
    [
        "",
        "worker-1",
        "{host}:1",
        "{host}:notapid:123:abc",
        "{host}:{pid}:notticks:abc",
        "{host}:{pid}:0:abc",  # start time unknown: cannot tell reuse from life
        "{host}:{pid}:1:2:3",
    ],
)
def test_owners_it_cannot_judge_are_not_dead(owner: str) -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    text = owner.format(host=socket.gethostname(), pid=pid_max + 1)
    assert owner_is_dead_locally(text) is False
