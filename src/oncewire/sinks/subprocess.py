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

When the dispatcher gives up on an attempt (its ``attempt_timeout``), it calls
:meth:`SubprocessSink.cancel`, which kills that attempt's child.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from oncewire.core.canonical import canonical_json
from oncewire.effects.attempt import Attempt
from oncewire.effects.outcomes import Done, EffectOutcome, MaybeSent, NotSent, Rejected

__all__ = ["SubprocessSink"]


class SubprocessSink:
    """A sink that runs ``argv`` once per attempt, payload on stdin, and reads the outcome from
    its exit status (see the module's docstring for the mapping)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        timeout_seconds: float = 60.0,
        env: Mapping[str, str] | None = None,
        rejected_exit_codes: Collection[int] = (65,),
        not_sent_exit_codes: Collection[int] = (75,),
        keep_history: bool = False,
    ) -> None:
        self.argv = list(argv)
        self.timeout_seconds = timeout_seconds
        self.env = dict(env) if env is not None else None
        self.rejected_exit_codes = frozenset(rejected_exit_codes)
        self.not_sent_exit_codes = frozenset(not_sent_exit_codes)
        self.keep_history = keep_history
        self.history: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._children: dict[tuple[str, int], subprocess.Popen[str]] = {}  # (key, fence)

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
        try:
            process = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=self._environment(attempt),
            )
        except OSError as exc:
            return NotSent(f"could not start {self.argv[0]}: {exc}")
        slot = (attempt.key, attempt.fence)
        with self._lock:
            self._children[slot] = process
        try:
            try:
                stdout, stderr = process.communicate(
                    canonical_json(attempt.payload), timeout=self.timeout_seconds
                )
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, stderr = process.communicate()
                self._remember(attempt, process, stdout, stderr)
                return MaybeSent(f"{self.argv[0]} timed out after {self.timeout_seconds}s")
        finally:
            with self._lock:
                self._children.pop(slot, None)
        self._remember(attempt, process, stdout, stderr)
        code = process.returncode
        if code == 0:
            try:
                return Done(json.loads(stdout) if stdout.strip() else None)
            except json.JSONDecodeError:
                return Done({"stdout": stdout})
        detail = (stderr.strip() or stdout.strip()).splitlines()
        reason = f"exit {code}" + (f": {detail[-1][:200]}" if detail else "")
        if code in self.rejected_exit_codes:
            return Rejected(reason)
        if code in self.not_sent_exit_codes:
            return NotSent(reason)
        if code < 0:
            reason = f"killed by signal {-code}"
        return MaybeSent(reason)

    def cancel(self, attempt: Attempt) -> None:
        """Kill the child running ``attempt`` (the dispatcher gave up on it)."""
        with self._lock:
            process = self._children.get((attempt.key, attempt.fence))
        if process is not None and process.poll() is None:
            process.kill()

    def _remember(
        self, attempt: Attempt, process: subprocess.Popen[str], stdout: str, stderr: str
    ) -> None:
        if not self.keep_history:
            return
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
                    "stderr": stderr,
                }
            )
