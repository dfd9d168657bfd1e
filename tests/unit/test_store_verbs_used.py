"""Every store verb is there for the package: a verb only tests call is a second way to reach
the tables that the product never takes, so it goes (tests read the tables directly)."""

from __future__ import annotations

import abc
import re
from pathlib import Path

from oncewire.storage import Store

ROOT = Path(__file__).resolve().parents[2]


def _verbs() -> set[str]:
    families = [cls for cls in Store.__mro__ if cls not in (object, abc.ABC)]
    return {
        name
        for cls in families
        for name, member in vars(cls).items()
        if not name.startswith("_") and callable(member)
    }


def _product_text() -> str:
    files = [*(ROOT / "src" / "oncewire").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
    return "".join(path.read_text() for path in sorted(files))


# An attribute use: called, or handed on as a bound method (``partial(store.verb, tx)``).
# Neither a query of the same name (``q.verb``, ``db.queries.verb``) nor a docstring's
# ``:meth:`Store.verb``` is a use of the verb.
_ATTRIBUTE = re.compile(r"(?<![^\w]q)(?<!queries)\.(\w+)\b(?!`)")


def _used(text: str) -> set[str]:
    """Every name ``text`` uses as an attribute, read in one pass."""
    return set(_ATTRIBUTE.findall(text))


def _base(verb: str) -> str:
    return verb.removesuffix("_in_tx")


def test_every_store_verb_has_a_caller_in_the_package() -> None:
    verbs = _verbs()
    text = _product_text()
    used = verbs & _used(text)
    # A pair derived from one function (storage/twins.py) is one verb: either form used is enough.
    used_bases = {_base(verb) for verb in used}
    unused = sorted(verb for verb in verbs if _base(verb) not in used_bases)
    assert unused == [], f"Store verbs nothing in the package calls: {', '.join(unused)}"


def test_the_check_sees_a_verb_the_package_calls_and_one_it_does_not() -> None:
    used = _used(_product_text())
    assert "dispatch_step" in used
    assert "no_such_verb_anywhere" not in used
    assert "get_lease" not in _used("rows = db.read(q.get_lease) and db.queries.get_lease")
    assert "get_lease" not in _used("see :meth:`Store.get_lease`")
    assert "get_lease" in _used("lease = self.store.get_lease(name)")
    assert "dispatch_step" in _verbs() and "get_lease" in _verbs()
