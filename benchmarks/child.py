"""Child processes for the recovery figures. run.py starts them; they are not meant for people.

python benchmarks/child.py claim DB N
    accept N effects (one transaction), then run a dispatcher with batch_size=N whose sink
    blocks forever: all N are claimed and committed. Prints "claimed" at the first sink
    call and waits there to be SIGKILLed.

python benchmarks/child.py dispatch DB BATCH
    run a dispatcher with a no-op sink until idle and print its timings as one JSON line.
"""

from __future__ import annotations

import time

STARTED = time.monotonic()  # before any import that costs something

import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from typing import Any  # noqa: E402

from common import KIND, effect_key, effect_payload, timed_dispatch  # noqa: E402
from oncewire import Dispatcher, Ledger  # noqa: E402

IMPORTED = time.monotonic()


def claim(db: str, n: int) -> None:
    ledger = Ledger(db)
    with ledger.transaction() as tx:
        for i in range(n):
            tx.accept(effect_key(i), KIND, effect_payload(i))
    forever = threading.Event()

    def block(attempt: Any) -> None:
        sys.stdout.write("claimed\n")
        sys.stdout.flush()
        forever.wait()

    Dispatcher(ledger, {KIND: block}, batch_size=n).run()


def dispatch(db: str, batch_size: int) -> None:
    timing = timed_dispatch(db, batch_size)
    report = dataclasses.asdict(timing)
    report.update(started=STARTED, imported=IMPORTED)
    sys.stdout.write(json.dumps(report) + "\n")


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "claim":
        claim(argv[1], int(argv[2]))
    elif len(argv) == 3 and argv[0] == "dispatch":
        dispatch(argv[1], int(argv[2]))
    else:
        sys.stderr.write(__doc__ or "")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
