"""Group commit (``group_commit=True``): concurrent callers of one process share commits.

A store opened with ``group_commit=True`` (``Ledger(..., group_commit=True)``,
``open_store(..., group_commit=True)``) lets the write transactions that many threads of one
process open with :meth:`~oncewire.storage.store.Store.transaction` (``ledger.transaction()``,
``Ledger.accept``) become durable together, so that concurrent callers are not held to one
flush of the disk per commit each. Every caller still returns only once its own transaction
is durable, and each caller's transaction is still all or nothing.

- SQLite (:mod:`oncewire.storage.sqlite.group`): one shared transaction on one connection.
  Each caller's block runs inside a savepoint of it, one caller at a time; the first caller to
  finish its block when no commit is under way leads: it commits for every caller whose block
  ended before its turn came, with one ``COMMIT`` (one flush), and releases them. A caller whose
  block fails is rolled back to its savepoint alone; a failing shared ``COMMIT`` fails every
  caller of its group, and nothing of the group is stored.
- PostgreSQL: each thread keeps its own connection and its own commits; the server flushes the
  commit records of concurrent sessions together (its own group commit, see ``commit_delay``),
  which is what sharing a transaction would buy, without serialising the callers.

The crash points below are where the lab kills a process at the shared commit, on both
backends (on PostgreSQL at each thread's commit).
"""

from __future__ import annotations

from oncewire.core import crash

__all__ = ["AFTER_SHARED_COMMIT", "BEFORE_SHARED_COMMIT"]

BEFORE_SHARED_COMMIT = crash.register(
    "storage.group_commit.before_commit",
    "the callers of a group wrote their rows and effects; the shared commit has not run",
)
AFTER_SHARED_COMMIT = crash.register(
    "storage.group_commit.after_commit",
    "the shared commit is durable; no caller of the group has been told yet",
)
