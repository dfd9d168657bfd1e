"""Every store verb written once, over the store's :class:`~oncewire.storage.driver.Driver`.

Each module holds the verbs of one ledger as a class that a backend's store inherits; its
statements are named queries of :mod:`oncewire.storage.sql`. Ported so far: effects (with the
attempt history), receipts, and inbound messages with their replies. The run verbs still live in
the dialect modules (``storage/{sqlite,postgres}/{runs,run_scopes}.py``); porting one means moving
its statements into ``storage/sql/<ledger>.sql`` and its body here, as the module docstring of
:mod:`oncewire.storage.sql` describes.
"""
