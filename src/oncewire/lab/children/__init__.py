"""The lab's child processes, one module per area, each run as ``python -m`` by a suite.

:mod:`~oncewire.lab.children.effects` (accept, dispatch, the downstream service, torture
workers), :mod:`~oncewire.lab.children.replies` (the chat application around the reply engine)
and :mod:`~oncewire.lab.children.runs` (run-ledger roles and reconciliation). Each prints one
JSON object on stdout, so a suite can read what it did before the lab checks the stores.
"""
