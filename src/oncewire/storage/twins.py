"""A verb's two forms, written once: in a transaction of its own, and in the caller's.

Many verbs come as a pair: ``name(...)`` commits on its own, ``name_in_tx(tx, ...)`` writes in
the caller's open transaction (:class:`~oncewire.storage.transaction.Transaction`) and commits
with it. Where the plain form only opens a transaction of its own and then does what the
``_in_tx`` form does, the pair is derived here from one function instead of being written twice:

* :func:`verb_twins`, for a store verb: both forms from one function of the connection, the
  plain form in ``db.write(what)``, the ``_in_tx`` form on the caller's connection with its
  driver errors translated as ``what`` (the same label in both);
* :func:`own_transaction`, for a ledger above the store: the plain form from the ``_in_tx``
  form, run by the ledger's own way of opening (and committing) a transaction.

The derived methods are plain functions with the names, docstrings and signatures of the
methods they replace (:func:`inspect.signature` and help show them); mypy checks every call
through :class:`~typing.ParamSpec`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

from oncewire.storage.driver import Driver, Transaction

__all__ = ["own_transaction", "verb_twins"]

P = ParamSpec("P")
R = TypeVar("R")
L = TypeVar("L")


class _Verbs(Protocol):
    """What a store verb runs on: the store's driver."""

    db: Driver


V = TypeVar("V", bound=_Verbs)


def verb_twins(
    what: str,
    core: Callable[Concatenate[V, Any, P], R],
    *,
    in_tx_doc: str | None = None,
    check: Callable[P, object] | None = None,
) -> tuple[Callable[Concatenate[V, P], R], Callable[Concatenate[V, Transaction, P], R]]:
    """``(name, name_in_tx)``, the two forms of the store verb ``core(self, conn, ...)``, whose
    name is ``_name`` and whose docstring is the plain form's.

    ``name(...)`` runs ``core`` in a transaction of its own (``self.db.write(what)``),
    ``name_in_tx(tx, ...)`` on the connection of the caller's transaction ``tx``, refused if
    it is not open, with driver errors translated as ``what``; ``in_tx_doc`` is its docstring
    (by default, the plain form's in the caller's transaction). ``check(...)``, given the same
    arguments, refuses them in either form before anything is opened or read."""
    name = core.__name__.removeprefix("_")

    def alone(self: V, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if check is not None:
            check(*args, **kwargs)
        with self.db.write(what) as conn:
            return core(self, conn, *args, **kwargs)

    def in_tx(self: V, tx: Transaction, *args: P.args, **kwargs: P.kwargs) -> R:
        if check is not None:
            check(*args, **kwargs)
        db = self.db
        with db.in_tx(tx, what) as conn:
            return core(self, conn, *args, **kwargs)

    signature = inspect.signature(core)
    self_param, _conn, *rest = signature.parameters.values()
    tx_param = inspect.Parameter(
        "tx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="Transaction"
    )
    _name(alone, core, name, core.__doc__, signature.replace(parameters=[self_param, *rest]))
    _name(
        in_tx,
        core,
        f"{name}_in_tx",
        in_tx_doc or f":meth:`{name}` in the caller's transaction.",
        signature.replace(parameters=[self_param, tx_param, *rest]),
    )
    # ``tx`` may be passed by name too, as it could to the methods written by hand; the type
    # keeps it positional (as every caller passes it), since a ParamSpec cannot promise that
    # the core's own parameters are not named ``tx``.
    return alone, cast(Callable[Concatenate[V, Transaction, P], R], in_tx)


def own_transaction(
    in_tx: Callable[Concatenate[L, Transaction, P], R],
    run: Callable[[L, Callable[[Transaction], R]], R],
    doc: str,
) -> Callable[Concatenate[L, P], R]:
    """The plain form of the ledger method ``in_tx`` (named ``name_in_tx``): ``name(...)`` is
    ``run(self, write)``, where ``run`` opens the ledger's transaction of its own, calls
    ``write(tx)`` inside it and commits, and ``write`` is ``in_tx(self, tx, ...)`` with the
    same arguments. ``doc`` is its docstring."""
    name = in_tx.__name__.removesuffix("_in_tx")

    def alone(self: L, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return run(self, lambda tx: in_tx(self, tx, *args, **kwargs))

    signature = inspect.signature(in_tx)
    self_param, _tx, *rest = signature.parameters.values()
    _name(alone, in_tx, name, doc, signature.replace(parameters=[self_param, *rest]))
    return alone


def _name(
    derived: Callable[..., Any],
    source: Callable[..., Any],
    name: str,
    doc: str | None,
    signature: inspect.Signature,
) -> None:
    """Give ``derived`` the name, place, docstring and signature of the method it is."""
    derived.__name__ = name
    derived.__qualname__ = f"{source.__qualname__.rpartition('.')[0]}.{name}".lstrip(".")
    derived.__module__ = source.__module__
    derived.__doc__ = doc
    derived.__dict__["__signature__"] = signature
