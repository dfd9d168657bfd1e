"""The fault matrix: three platform profiles x every wire fault x streaming or not x short
and long replies (long is over both caps). Faults fire on the operation that carries the
reply's final words (its footer), or on the reply's first operation; the invariants are read
from the fake platforms' journals and the database."""

from __future__ import annotations

from pathlib import Path

import pytest

from oncewire.lab.suites.replies_rig import LONG_BODY, PROFILES, Rig, footer, header, reply_text
from oncewire.testing import ManualClock
from oncewire.testing.fake_platform import Fault

# fault id -> (fault kind or None, target, expectation when the faulted op is a send)
# target "footer": the first operation whose text carries the final words; "first": the
# reply's first operation. Expectations: "exact" = one unmarked copy and nothing else;
# "one_copy" = one complete copy, which may carry the marker (a send that timed out may have
# landed as far as the engine can know); "marked_dupes" = the platform holds a second copy,
# and every copy but one is marked.
FAULTS = {
    "clean": (None, "footer", "exact"),
    "rate_limit": ("rate_limit", "footer", "exact"),
    "rate_limit_long": ("rate_limit", "footer", "exact"),
    "conn_error": ("conn_error", "footer", "exact"),
    "timeout": ("timeout", "footer", "one_copy"),
    "ack_lost": ("ack_lost", "footer", "marked_dupes"),
    "first_timeout": ("timeout", "first", "one_copy"),
    "first_conn_error": ("conn_error", "first", "exact"),
    "first_rate_limit": ("rate_limit", "first", "exact"),
    # Parked operations that time out instead of being killed (the crash lab kills them).
    "hold": ("hold", "footer", "one_copy"),
    "hold_after": ("hold_after", "footer", "marked_dupes"),
}
SIZES = {"short": "a short answer.", "long": LONG_BODY}
MODES = ("off", "one", "two", "many")


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("platform", list(PROFILES))
def test_fault_matrix(tmp_path: Path, platform: str, fault: str, mode: str, size: str) -> None:
    kind, target, expect = FAULTS[fault]
    aid = f"A-{platform}-{fault}-{mode}-{size}"
    chat = f"c-{fault}-{mode}-{size}"
    faults = []
    if kind is not None:
        faults.append(
            Fault(
                kind,
                platform=platform,
                chat=chat,
                contains=footer(aid) if target == "footer" else header(aid),
                retry_after=600.0 if fault == "rate_limit_long" else 1.0,
                hold_seconds=0.0,
            )
        )
    with Rig(tmp_path, clock=ManualClock(), faults=faults, synchronous="NORMAL") as rig:
        admission = rig.admit(platform, chat, "in-1")
        text = reply_text(aid, SIZES[size])
        result = rig.answer(admission.inbound.id, text, mode)
        if fault == "rate_limit_long":
            # A long wait is scheduled on the record, never slept inline.
            assert result.status == "scheduled"
            rig.settle()
        assert rig.platforms[platform].calls, "the platform was never called"
        fired = [f for f in rig.view().faults if f["chat"] == chat]
        assert len(fired) == (0 if kind is None else 1)
        ops = rig.ledger.replies.ops(result.reply.id)
        faulted_edit = kind is not None and fired and fired[0]["op"] == "edit"
        # A faulted edit is repaired by an idempotent edit: nothing else shows.
        failures = rig.check(
            platform, chat, aid, admission.inbound.id, "exact" if faulted_edit else expect
        )
        assert not failures, "\n".join(failures)
        if expect == "exact" or faulted_edit:
            assert not any(op.marked for op in ops), "a marker without a possible duplicate"
