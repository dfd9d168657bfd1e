"""Every store verb written once, over the store's :class:`~oncewire.storage.driver.Driver`.

Each module holds the verbs of one ledger as a class that a backend's store inherits; its
statements are named queries of :mod:`oncewire.storage.sql`: effects (with the attempt
history), receipts, inbound messages with their replies, and the run ledger (``runs`` and
``run_scopes``). A new verb is written the same way, as the module docstring of
:mod:`oncewire.storage.sql` describes; what differs per dialect goes into ``postgresql.sql`` or
the driver (:mod:`oncewire.storage.driver`), never into a verb.
"""
