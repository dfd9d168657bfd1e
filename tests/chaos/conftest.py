"""A PostgreSQL cluster of the chaos tests' own, which they crash and bring back.

The shared server at 127.0.0.1:5432 must never die under other tests, so the tests that stop
the database start a private cluster: ``initdb`` in a temporary directory owned by the
``postgres`` user (initdb refuses root), its own free port on 127.0.0.1, its unix socket in that
directory, and the durability settings of a real server (``fsync`` and ``full_page_writes`` on):
``pg_ctl stop -m immediate`` is a crash, and the next ``pg_ctl start`` replays the WAL.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncewire.lab.ports import stable_port

BIN = Path(os.environ.get("ONCEWIRE_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
USER = "postgres"


class PrivateCluster:
    """One initdb'd cluster: ``crash()`` stops it with immediate shutdown, ``start()`` brings it
    back (crash recovery), ``url`` reaches its ``postgres`` database over TCP."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.log = root / "server.log"
        self.port = stable_port()
        self.url = f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["runuser", "-u", USER, "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
            check=False,
        )

    def initdb(self) -> None:
        done = self._run(
            str(BIN / "initdb"), "-D", str(self.data), "--auth=trust", "-U", USER, "-E", "UTF8"
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr[-800:]}")
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.root}'",
            "fsync": "on",
            "full_page_writes": "on",
            "synchronous_commit": "on",
            "max_connections": "100",
            "shared_buffers": "32MB",
        }
        with (self.data / "postgresql.auto.conf").open("a") as conf:
            for name, value in settings.items():
                conf.write(f"{name} = {value}\n")

    def start(self) -> None:
        """Start the cluster and wait until it answers (after crash recovery, if any)."""
        done = self._run(
            str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
            "start",
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {done.stderr[-400:]}\n{self.tail()}")
        self.wait_ready()

    def crash(self) -> None:
        """Immediate shutdown: every backend is killed, nothing is checkpointed (a crash)."""
        done = self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl stop -m immediate failed: {done.stderr[-400:]}")

    def running(self) -> bool:
        done = self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "status")
        return done.returncode == 0

    def wait_ready(self, timeout: float = 60) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=3, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.Error:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def recovered_from_crash(self) -> bool:
        """Whether the server log says a start replayed the WAL after an unclean stop."""
        text = self.log.read_text(errors="replace")
        return "was not properly shut down" in text and "redo done" in text

    def destroy(self) -> None:
        if self.data.exists() and self.running():
            self.crash()
        shutil.rmtree(self.root, ignore_errors=True)


def _cluster_unavailable() -> str | None:
    if not (BIN / "initdb").exists():
        return f"no PostgreSQL binaries in {BIN} (set ONCEWIRE_TEST_PG_BIN)"
    if shutil.which("runuser") is None:
        return "runuser is needed to run a private cluster as the postgres user"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return "no postgres user to run a private cluster as"
    if os.geteuid() != 0:
        return "a private cluster is started as the postgres user, which needs root"
    return None


@pytest.fixture(scope="module")
def pg_cluster() -> Iterator[PrivateCluster]:
    """A private PostgreSQL cluster for this module; always stopped and removed at the end."""
    reason = _cluster_unavailable()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="oncewire-chaos-pg-"))
    user = pwd.getpwnam(USER)
    os.chown(root, user.pw_uid, user.pw_gid)
    cluster = PrivateCluster(root)
    try:
        cluster.initdb()
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()
