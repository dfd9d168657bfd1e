"""``python -m oncewire.testing``: the journaled fake chat platform from the command line.

``view JOURNAL...`` prints what each chat shows, one JSON object per visible message, as
:class:`~oncewire.testing.ChatView` reads the journals; ``serve ...`` runs one fake
as its own process (:mod:`oncewire.testing.fake_platform_process`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from oncewire.testing.fake_platform import ChatView
from oncewire.testing.fake_platform_process import main as serve_main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        return serve_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m oncewire.testing")
    sub = parser.add_subparsers(dest="command", required=True)
    view = sub.add_parser("view", help="print what every chat shows, from journals")
    sub.add_parser("serve", help="serve one fake platform on a Unix socket")
    view.add_argument("journals", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for message in ChatView(args.journals).messages:
        print(
            json.dumps(
                {
                    "platform": message.platform,
                    "chat": message.chat,
                    "thread": message.thread,
                    "message_id": message.message_id,
                    "edits": message.edits,
                    "text": message.text,
                },
                ensure_ascii=False,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
