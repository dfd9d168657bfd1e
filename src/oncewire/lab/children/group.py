"""The group suite's child: ``python -m oncewire.lab.children.group accept ...``.

accept  ``--threads`` threads of one process, each running ``--per-thread`` transactions on a
        ledger opened with ``group_commit=True``: each writes the caller's row (``operations``)
        and accepts its effect in one transaction; every ``--fail-every``-th one raises inside
        its block instead (rolled back alone). Each thread tells the journal what it did, one
        line per event, written with ``O_APPEND`` so that lines of several threads never mix:
        ``wrote KEY`` inside the block once both rows are written, ``ok KEY`` once the
        transaction returned, ``failed KEY`` once a refused one raised. A line is written right
        after the event and before the next, so a SIGKILL loses at most what no line says yet.

Prints one JSON object on stdout when every thread is done.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import Any

from oncewire.core import crash
from oncewire.core.canonical import canonical_json
from oncewire.lab.fixtures import KIND

MODULE = "oncewire.lab.children.group"


class _Refused(Exception):
    """The caller changes its mind inside its block."""


def _journal(fd: int, event: str, key: str) -> None:
    os.write(fd, f"{event} {key}\n".encode())


def accept(args: argparse.Namespace) -> dict[str, Any]:
    from oncewire.ledger import Ledger

    fd = os.open(args.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    counts = {"ok": 0, "failed": 0}
    lock = threading.Lock()
    errors: list[str] = []

    with Ledger(args.caller, group_commit=True) as ledger:

        def caller(thread: int) -> None:
            for n in range(args.per_thread):
                key = f"{args.run}-t{thread}-{n:04d}"
                refuse = args.fail_every > 0 and n % args.fail_every == args.fail_every - 1
                payload = {"key": key, "thread": thread}
                try:
                    with ledger.transaction() as tx:
                        tx.execute(
                            "INSERT INTO operations (id, payload, created_by) "
                            "VALUES (:id, :payload, :pid)",
                            {"id": key, "payload": canonical_json(payload), "pid": os.getpid()},
                        )
                        tx.accept(key, KIND, payload)
                        _journal(fd, "wrote", key)
                        if refuse:
                            raise _Refused(key)
                except _Refused:
                    _journal(fd, "failed", key)
                    with lock:
                        counts["failed"] += 1
                    continue
                except Exception as exc:  # reported, and counted against the run
                    with lock:
                        errors.append(f"{key}: {type(exc).__name__}: {exc}")
                    continue
                _journal(fd, "ok", key)
                with lock:
                    counts["ok"] += 1

        threads = [threading.Thread(target=caller, args=(t,)) for t in range(args.threads)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        shared = ledger.store.shared_commits()
    os.close(fd)
    return {**counts, "errors": errors[:20], "shared_commits": shared}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    parser.add_argument("role", choices=["accept"])
    parser.add_argument("--caller", required=True, help="the caller's store (file or URL)")
    parser.add_argument("--journal", required=True, help="the file the threads append to")
    parser.add_argument("--run", required=True, help="a prefix that makes this run's keys new")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--per-thread", type=int, default=40)
    parser.add_argument("--fail-every", type=int, default=7)
    args = parser.parse_args(argv)
    import oncewire.storage.grouping  # noqa: F401  (registers the points this role reaches)

    crash.check_armed()
    print(json.dumps(accept(args), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
