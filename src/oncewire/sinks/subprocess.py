"""A sink that performs an effect by running a command.

The payload goes to the command's stdin as canonical JSON; the attempt is described in its
environment (``ONCEWIRE_KEY``, ``ONCEWIRE_KIND``, ``ONCEWIRE_ATTEMPT``, ``ONCEWIRE_REDELIVERY``,
``ONCEWIRE_FENCE``). The exit status is the outcome, decided here because only here do we know
whether the command ran at all:

* it could not be started -> ``NotSent`` (nothing ran);
* exit 0 -> ``Done`` with stdout parsed as JSON (or ``{"stdout": text}``);
* an exit code in ``rejected_exit_codes`` (default 65, EX_DATAERR) -> ``Rejected``;
* an exit code in ``not_sent_exit_codes`` (default 75, EX_TEMPFAIL) -> ``NotSent``: the command
  promises it changed nothing;
* anything else, a signal, or a timeout -> ``MaybeSent``: it ran and we cannot know how far.

Each command runs in a process group of its own (a new session), so it can be stopped with
everything it started: ``timeout_seconds`` bounds the whole exchange (writing stdin, reading
stdout and stderr to their end, the exit), and when it runs out the group is killed (SIGKILL),
the pipes are closed unread and the command is waited for at most ``KILLED_WAIT_SECONDS``. A
child that holds the pipes open after the command exited keeps the exchange going, and is
killed with it at the timeout.
When the dispatcher gives up on an attempt (its ``attempt_timeout``), it calls
:meth:`SubprocessSink.cancel`, which kills that attempt's process group. A descendant that
leaves the group (``setsid``) is beyond reach, as it would be for any supervisor.

Output is bounded in memory: at most ``max_output_bytes`` of stdout are kept (the rest is read
and dropped, and counted: on exit 0 the result is then ``{"stdout": the first part,
"stdout_cut_bytes": n}``) and the last ``max_output_bytes`` of stderr (whose last line is the
reason of a failure).
"""

from __future__ import annotations

import json
import os
import select
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import IO, Any

from oncewire.core.canonical import canonical_json
from oncewire.core.limits import DEFAULT_MAX_RESULT_BYTES, MAX_PAYLOAD_BYTES_LIMIT, check_count
from oncewire.effects.attempt import Attempt
from oncewire.effects.outcomes import Done, EffectOutcome, MaybeSent, NotSent, Rejected

__all__ = ["DEFAULT_MAX_OUTPUT_BYTES", "KILLED_WAIT_SECONDS", "SubprocessSink"]

DEFAULT_MAX_OUTPUT_BYTES = DEFAULT_MAX_RESULT_BYTES  # of stdout, and of stderr, per attempt
KILLED_WAIT_SECONDS = 2.0  # after SIGKILL to its group: how long the command is waited for
_CHUNK_BYTES = 65536


class _Kept:
    """What is kept of one output stream: its first ``limit`` bytes (or its last, with
    ``keep_end``), and how many bytes were dropped."""

    def __init__(self, limit: int, *, keep_end: bool = False) -> None:
        self.limit = limit
        self.keep_end = keep_end
        self.data = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        if self.keep_end:
            self.data += chunk
            extra = len(self.data) - self.limit
            if extra > 0:
                del self.data[:extra]
                self.dropped += extra
            return
        room = self.limit - len(self.data)
        self.data += chunk[:room]
        self.dropped += max(0, len(chunk) - room)

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def _close(stream: IO[bytes] | None) -> None:
    if stream is not None:
        try:
            stream.close()
        except OSError:  # a pipe the command closed first
            pass


def _exchange(
    process: subprocess.Popen[bytes], data: bytes, out: _Kept, err: _Kept, deadline: float | None
) -> bool:
    """Write ``data`` to the command's stdin and read its stdout and stderr until both end or
    ``deadline`` (``time.monotonic()``) passes; True when they ended. The same exchange as
    ``Popen.communicate``, with every stream bounded in memory and time."""
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    stdin = process.stdin
    offset = 0
    with selectors.DefaultSelector() as selector:
        selector.register(stdin, selectors.EVENT_WRITE)
        selector.register(process.stdout, selectors.EVENT_READ, out)
        selector.register(process.stderr, selectors.EVENT_READ, err)
        while selector.get_map():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            for key, _ in selector.select(remaining):
                if key.fileobj is stdin:
                    try:
                        offset += os.write(key.fd, data[offset : offset + select.PIPE_BUF])
                    except BrokenPipeError:  # the command does not read its stdin
                        offset = len(data)
                    if offset >= len(data):
                        selector.unregister(stdin)
                        _close(stdin)
                    continue
                chunk = os.read(key.fd, _CHUNK_BYTES)
                if chunk:
                    key.data.add(chunk)
                else:
                    selector.unregister(key.fileobj)
    return True


class SubprocessSink:
    """A sink that runs ``argv`` once per attempt, payload on stdin, and reads the outcome from
    its exit status (see the module's docstring for the mapping, the timeout and the bounds on
    output)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        timeout_seconds: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        rejected_exit_codes: Collection[int] = (65,),
        not_sent_exit_codes: Collection[int] = (75,),
        keep_history: bool = False,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        self.argv = list(argv)
        self.timeout_seconds = timeout_seconds
        self.env = dict(env) if env is not None else None
        self.rejected_exit_codes = frozenset(rejected_exit_codes)
        self.not_sent_exit_codes = frozenset(not_sent_exit_codes)
        self.keep_history = keep_history
        self.max_output_bytes = check_count(
            "max_output_bytes", max_output_bytes, 1, MAX_PAYLOAD_BYTES_LIMIT
        )
        self.history: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._children: dict[tuple[str, int], subprocess.Popen[bytes]] = {}  # (key, fence)

    def _environment(self, attempt: Attempt) -> dict[str, str]:
        env = dict(os.environ if self.env is None else self.env)
        env.update(
            ONCEWIRE_KEY=attempt.key,
            ONCEWIRE_KIND=attempt.kind,
            ONCEWIRE_ATTEMPT=str(attempt.number),
            ONCEWIRE_REDELIVERY="1" if attempt.redelivery else "0",
            ONCEWIRE_FENCE=str(attempt.fence),
        )
        return env

    def __call__(self, attempt: Attempt) -> EffectOutcome:
        timeout = self.timeout_seconds
        try:
            process = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._environment(attempt),
                start_new_session=True,  # its own process group: killed with all it started
            )
        except OSError as exc:
            return NotSent(f"could not start {self.argv[0]}: {exc}")
        deadline = None if timeout is None else time.monotonic() + timeout
        out = _Kept(self.max_output_bytes)
        err = _Kept(self.max_output_bytes, keep_end=True)
        slot = (attempt.key, attempt.fence)
        with self._lock:
            self._children[slot] = process
        try:
            payload = canonical_json(attempt.payload).encode("utf-8")
            finished = _exchange(process, payload, out, err, deadline)
            if finished:
                try:
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    process.wait(timeout=left)
                except subprocess.TimeoutExpired:  # it closed its output and went on running
                    finished = False
            if not finished:
                _kill_group(process)
                try:
                    process.wait(timeout=KILLED_WAIT_SECONDS)
                except subprocess.TimeoutExpired:  # not reaped yet; its exit code stays unknown
                    pass
        finally:
            with self._lock:
                self._children.pop(slot, None)
            for stream in (process.stdin, process.stdout, process.stderr):
                _close(stream)
        self._remember(attempt, process, out, err)
        if not finished:
            return MaybeSent(
                f"{self.argv[0]} timed out after {timeout:g}s; its process group was killed"
            )
        code = process.returncode
        if code == 0:
            if out.dropped:
                return Done({"stdout": out.text(), "stdout_cut_bytes": out.dropped})
            stdout = out.text()
            try:
                return Done(json.loads(stdout) if stdout.strip() else None)
            except json.JSONDecodeError:
                return Done({"stdout": stdout})
        detail = (err.text().strip() or out.text().strip()).splitlines()
        reason = f"exit {code}" + (f": {detail[-1][:200]}" if detail else "")
        if code in self.rejected_exit_codes:
            return Rejected(reason)
        if code in self.not_sent_exit_codes:
            return NotSent(reason)
        if code < 0:
            reason = f"killed by signal {-code}"
        return MaybeSent(reason)

    def cancel(self, attempt: Attempt) -> None:
        """Kill the process group running ``attempt`` (the dispatcher gave up on it)."""
        with self._lock:
            process = self._children.get((attempt.key, attempt.fence))
        if process is not None:
            _kill_group(process)

    def _remember(
        self, attempt: Attempt, process: subprocess.Popen[bytes], out: _Kept, err: _Kept
    ) -> None:
        if not self.keep_history:
            return
        stdout = out.text()
        try:
            response: Any = json.loads(stdout) if stdout.strip() else None
        except json.JSONDecodeError:
            response = stdout
        with self._lock:
            self.history.append(
                {
                    "key": attempt.key,
                    "attempt": attempt.number,
                    "redelivery": attempt.redelivery,
                    "pid": process.pid,
                    "exit_code": process.returncode,
                    "response": response,
                    "stderr": err.text(),
                }
            )


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command's process group (its pid: it leads a session of its own)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the whole group has already exited
        pass
