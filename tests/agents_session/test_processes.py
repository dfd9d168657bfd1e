"""Two processes on one session (one SQLite file, or one PostgreSQL database): their appends
interleave whole and each keeps its own order; then their pops, racing, take every item they
take once, newest first, and what is left is the oldest part of the conversation."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oncewire import Ledger
from oncewire.agents import OncewireSession

CHILD = """
import asyncio, json, os, sys
from oncewire import Ledger
from oncewire.agents import OncewireSession

url, name, folder, adds, pops = sys.argv[1:6]

async def wait_for(flag):
    while not os.path.exists(os.path.join(folder, flag)):
        await asyncio.sleep(0.002)

async def main():
    with Ledger(url) as ledger:
        session = OncewireSession("shared", ledger)
        print("ready", flush=True)
        await wait_for("add")
        for i in range(int(adds)):
            pair = [{"role": "user", "content": f"{name}-{i}-{half}"} for half in "ab"]
            await session.add_items(pair)
        print("added", flush=True)
        await wait_for("pop")
        popped = [await session.pop_item() for _ in range(int(pops))]
        print(json.dumps(popped), flush=True)

asyncio.run(main())
"""

ADDS = 40  # pairs per process
POPS = 50  # per process: 100 of the 160 items


def test_two_processes_add_and_pop_on_one_session(
    db_url: str, tmp_path: Path, python_child: Callable[..., subprocess.Popen[str]]
) -> None:
    Ledger(db_url).close()  # the schema exists before the children open it
    children = [
        python_child(CHILD, db_url, name, str(tmp_path), str(ADDS), str(POPS))
        for name in ("p", "q")
    ]

    def each_says(word: str) -> None:
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline().strip()
            assert line == word, (line, child.stderr.read() if child.stderr else "")

    each_says("ready")
    (tmp_path / "add").touch()  # both at once
    each_says("added")
    with Ledger(db_url) as ledger:
        added = [item["content"] for item in _items(ledger)]
    assert len(added) == 2 * 2 * ADDS
    for start in range(0, len(added), 2):  # each append's pair together, in order
        assert added[start].endswith("-a") and added[start + 1] == added[start][:-1] + "b"
    for name in ("p", "q"):  # each process's appends in the order it made them
        mine = [int(text.split("-")[1]) for text in added[::2] if text.startswith(name)]
        assert mine == list(range(ADDS))

    (tmp_path / "pop").touch()
    popped = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        popped.append(json.loads(out.strip().splitlines()[-1]))
    with Ledger(db_url) as ledger:
        left = [item["content"] for item in _items(ledger)]
    taken = [item["content"] for got in popped for item in got]
    assert len(taken) == len(set(taken)) == 2 * POPS  # every pop found one, none twice
    assert left == added[: len(added) - 2 * POPS]  # the oldest part is what is left
    assert sorted(taken) == sorted(added[len(left) :])
    for got in popped:  # each process took newer items before older ones
        places = [added.index(item["content"]) for item in got]
        assert places == sorted(places, reverse=True)


def _items(ledger: Ledger) -> list[Any]:
    return asyncio.run(OncewireSession("shared", ledger).get_items())
