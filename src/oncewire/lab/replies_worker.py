"""The replies lab's application process: ``python -m oncewire.lab.replies_worker answer ...``.

It plays a chat application around the reply engine, on the rig in ``--directory``: boot
recovery (deliver what is committed, list what is unanswered), admit the inbound message (a
re-delivery after a restart is recognised and not processed twice), then answer every
unanswered message with the scripted text of its answer id (streamed or not). The lab kills it
with SIGKILL (at an armed crash point, or while the fake platform parks an operation) and
starts it again on the same directory. It prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from oncewire.core import crash
from oncewire.core.clock import SystemClock
from oncewire.lab.replies_rig import LONG_BODY, Rig, reply_text
from oncewire.platforms.fake import Fault

BODIES = {"short": "the answer, computed before the crash.", "long": LONG_BODY}


def answer(
    folder: Path,
    *,
    platform: str,
    chat: str,
    message_id: str,
    aid: str,
    size: str,
    mode: str,
    faults: list[Fault],
) -> dict[str, Any]:
    with Rig(folder, clock=SystemClock(), faults=faults, inline_wait_max_seconds=2.0) as rig:
        rig.engine.backoff_base_seconds = 0.01
        report = rig.engine.recover()
        admission = rig.admit(platform, chat, message_id)
        answered = []
        for inbound_id in sorted(set(report.unanswered) | {admission.inbound.id}):
            inbound = rig.ledger.inbound.get(inbound_id)
            if inbound.status.value not in ("received", "answering"):
                continue
            if rig.ledger.inbound.start(inbound_id) is None:
                continue  # quarantined: it kept killing the process that answered it
            result = rig.answer(inbound_id, reply_text(aid, BODIES[size]), mode)
            answered.append({"inbound": inbound_id, "status": result.status})
        rig.settle()
        return {
            "new": admission.new,
            "deliveries": admission.inbound.deliveries,
            "recovery": report.as_dict(),
            "answered": answered,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oncewire.lab.replies_worker")
    parser.add_argument("role", choices=["answer"])
    parser.add_argument("--directory", type=Path, required=True)
    parser.add_argument("--platform", required=True)
    parser.add_argument("--chat", required=True)
    parser.add_argument("--message-id", required=True)
    parser.add_argument("--aid", required=True)
    parser.add_argument("--size", choices=sorted(BODIES), default="short")
    parser.add_argument("--mode", choices=["off", "one", "many"], default="off")
    parser.add_argument("--fault", action="append", default=[], help="JSON object of a Fault")
    args = parser.parse_args(argv)
    import oncewire.replies  # noqa: F401  (registers the replies crash points)

    crash.check_armed()
    faults = [Fault(**json.loads(spec)) for spec in args.fault]
    result = answer(
        args.directory,
        platform=args.platform,
        chat=args.chat,
        message_id=args.message_id,
        aid=args.aid,
        size=args.size,
        mode=args.mode,
        faults=faults,
    )
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
