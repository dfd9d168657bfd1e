"""The reply engine's planner: from a reply's operations, what each chunk slot shows, and the
next wire operations that bring the chat to the plan. Pure: no I/O, no clock of its own.

:func:`read_slots` folds the record's operations (in order) into what each slot is known to
show; :func:`plan_steps` compares that with the chunks wanted and lists what is still missing.
For each chunk slot of the plan:

* a slot whose message was acknowledged is edited if it shows something else (edits are
  idempotent and replayed freely) and never sent again;
* a slot with no message is sent; unmarked if no earlier send of it may have landed, with the
  duplicate marker if one may have (an ``ambiguous`` send, or one still ``in_flight`` when its
  process died), unless the platform still drops a repeat of that send's key: then that send
  is repeated as it was, and the step is ``interim`` when its body is not the wanted text (an
  edit must follow it, so it never finishes a delivery);
* a slot whose message someone else deleted (an edit or delete answered ``gone``) has no
  message again, and is sent again like one never sent;
* on the final delivery, slots beyond the plan are deleted (a withdrawal, a plan with no
  chunk, edits each preview to a note where the platform cannot delete).

It is separate from the engine so that the delivery algorithm is written once, whoever performs
the steps: the engine's live delivery and its recovery after a crash both run it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from oncewire.replies.splitting import Chunk
from oncewire.replies.wire import Platform
from oncewire.storage.replies import OpKind, OpState, ReplyOp

__all__ = ["DEFAULT_STOPPED_NOTE", "Slot", "Step", "plan_steps", "read_slots"]

DEFAULT_STOPPED_NOTE = "(stopped)"  # what a withdrawn preview shows where it cannot be deleted


@dataclass
class Slot:
    """What one chunk slot of a reply is known to show, read from its operations."""

    message_id: str | None = None
    shown: str | None = None  # the body the message is known to show (None: unknown)
    marked: bool = False  # the message was sent with the marker (edits keep it)
    maybe_landed: bool = False  # a send of this slot may have landed without an id
    deleted: bool = False
    uncertain: ReplyOp | None = None  # the first send that may have landed, under this key
    generation: int = 0  # messages of this slot someone else deleted: part of its send key


@dataclass(frozen=True, slots=True)
class Step:
    """One wire operation still missing: send, edit or delete ``slot`` (a send of generation
    ``generation``, under that generation's idempotency key). ``interim``: the slot will not
    show the wanted text after it (a repeat of an earlier send's body)."""

    slot: int
    kind: OpKind
    body: str
    marked: bool
    message_id: str | None
    generation: int = 0
    interim: bool = False


def read_slots(ops: Iterable[ReplyOp]) -> dict[int, Slot]:
    """Each slot's state after ``ops``, in the record's order (a later operation wins)."""
    slots: dict[int, Slot] = {}
    for op in ops:
        slot = slots.setdefault(op.slot, Slot())
        if op.kind is OpKind.SEND:
            if op.state is OpState.ACKED:
                slot.message_id, slot.shown, slot.marked = op.message_id, op.body, op.marked
                slot.deleted = False
            elif op.state in (OpState.IN_FLIGHT, OpState.AMBIGUOUS) and slot.message_id is None:
                slot.maybe_landed = True
                slot.uncertain = slot.uncertain or op
            elif op.state is OpState.GONE:
                # A new message gets a new key: an earlier uncertain send cannot be repeated
                # under it, so a resend is marked if one may have landed.
                slot.generation += 1
                slot.uncertain = None
        elif op.kind is OpKind.EDIT:
            if op.state is OpState.ACKED:
                slot.shown = op.body
            elif op.state in (OpState.IN_FLIGHT, OpState.AMBIGUOUS):
                slot.shown = None  # it may show either text: edit again
        elif op.kind is OpKind.DELETE and op.state is OpState.ACKED:
            slot.deleted = True
        if op.state is OpState.GONE and op.message_id == slot.message_id:
            # Someone else deleted the message: the slot shows nothing. maybe_landed stays as
            # it was, so a slot an earlier send may also have reached is re-sent marked.
            slot.message_id, slot.shown, slot.marked, slot.deleted = None, None, False, False
    return slots


def plan_steps(
    slots: Mapping[int, Slot],
    chunks: list[Chunk],
    final: bool,
    platform: Platform,
    note: str = DEFAULT_STOPPED_NOTE,
    now: float = 0.0,
) -> list[Step]:
    """The operations still missing for the chat to show ``chunks`` (``final``: the committed
    answer, whose surplus slots are deleted), in the order to perform them. Empty: converged."""
    profile = platform.profile
    steps: list[Step] = []
    if final and not chunks and not profile.can_delete and profile.can_edit:
        # A withdrawal where messages cannot be deleted: each preview says it stopped.
        for index, shown in sorted(slots.items()):
            if shown.message_id is not None and not shown.deleted and shown.shown != note:
                steps.append(Step(index, OpKind.EDIT, note, shown.marked, shown.message_id))
        return steps
    for index, chunk in enumerate(chunks):
        slot = slots.get(index)
        want = chunk.text
        if slot is not None and slot.message_id is not None and not slot.deleted:
            if slot.shown != want and profile.can_edit:
                steps.append(Step(index, OpKind.EDIT, want, slot.marked, slot.message_id))
        elif slot is None:
            steps.append(Step(index, OpKind.SEND, want, False, None))
        else:
            body, marked, first = want, slot.maybe_landed, slot.uncertain
            window = profile.idempotent_send_window_seconds
            if marked and first is not None and now - first.created_at < window:
                # The platform still drops a repeat of that send's key: the same body, with
                # the same rendering, shows once (an edit then brings it to the wanted text).
                body, marked = first.body, first.marked
            steps.append(
                Step(index, OpKind.SEND, body, marked, None, slot.generation, body != want)
            )
    if final and profile.can_delete:
        for index in sorted(slots):
            slot = slots[index]
            if index >= len(chunks) and slot.message_id is not None and not slot.deleted:
                steps.append(Step(index, OpKind.DELETE, "", False, slot.message_id))
    return steps
