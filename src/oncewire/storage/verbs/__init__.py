"""Every store verb written once, over the store's :class:`~oncewire.storage.driver.Driver`.

Each module holds the verbs of one ledger as one class, the ledger's seam: its methods are the
only way that ledger touches a database, and their docstrings are the contract.
:class:`~oncewire.storage.store.Store` inherits them all and adds the lifecycle, once, over the
driver (open, transaction, caller transaction, inspect, close). Their statements are named
queries of :mod:`oncewire.storage.sql`: effects (with the attempt history), receipts, inbound
messages, replies, and the run ledger (``runs`` and ``run_scopes``). A new verb is
written the same way, as the module docstring of :mod:`oncewire.storage.sql` describes; what
differs per dialect goes into ``postgresql.sql`` or the driver (:mod:`oncewire.storage.driver`),
never into a verb. A verb that comes as a pair, in a transaction of its own and in the caller's
(``_in_tx``), where the first only opens its transaction and does what the second does, is
written once over a connection, and :func:`~oncewire.storage.twins.verb_twins` makes both.
"""
