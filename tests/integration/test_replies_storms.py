"""Property: whatever sequence of wire faults hits the operation that carries a reply's final
words, the chat ends with a complete reply equal to the committed text, at most one unmarked
copy, every extra copy marked, no unmarked partial left, and no marker at all unless a send may
really have landed."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncewire.lab.suites.replies_rig import LONG_BODY, PROFILES, Rig, footer, reply_text
from oncewire.testing import ManualClock
from oncewire.testing.fake_platform import Fault

AMBIGUOUS = ("timeout", "ack_lost")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    platform=st.sampled_from(sorted(PROFILES)),
    mode=st.sampled_from(["off", "one", "two", "many"]),
    long=st.booleans(),
    storm=st.lists(
        st.sampled_from(["timeout", "ack_lost", "rate_limit", "conn_error"]), min_size=1, max_size=4
    ),
)
def test_fault_storm_on_the_final_operation(
    platform: str, mode: str, long: bool, storm: list[str]
) -> None:
    aid, chat = "A-storm", "storm"
    faults = [
        Fault(kind, contains=footer(aid), name=f"f{n}", retry_after=0.5)
        for n, kind in enumerate(storm)
    ]
    with (
        tempfile.TemporaryDirectory() as tmp,
        Rig(Path(tmp), clock=ManualClock(), faults=faults, synchronous="OFF") as rig,
    ):
        admission = rig.admit(platform, chat, "in-1")
        rig.answer(admission.inbound.id, reply_text(aid, LONG_BODY if long else "short."), mode)
        rig.settle()
        fired = rig.view().faults
        ambiguous_send = any(f["kind"] in AMBIGUOUS and f["op"] == "send" for f in fired)
        expect = "marked_dupes" if ambiguous_send else "exact"
        failures = rig.check(platform, chat, aid, admission.inbound.id, expect)
        assert not failures, (
            f"storm {storm} fired {[(f['op'], f['kind']) for f in fired]}\n" + "\n".join(failures)
        )
        reply = rig.ledger.replies.for_inbound(admission.inbound.id)
        assert reply is not None
        assert reply.marked == any(op.marked for op in rig.ledger.replies.ops(reply.id))
        if not ambiguous_send:
            assert not reply.marked
