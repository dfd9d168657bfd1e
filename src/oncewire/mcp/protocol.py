"""The names oncewire adds to the Model Context Protocol, shared by the proxy and the servers.

A ``tools/call`` request carries its idempotency key and, when it is a redelivery, the flag in
``params._meta``; a server whose tools run each call once says so among its capabilities'
``experimental`` entries, so that a proxy may redeliver a call whose outcome it does not know
instead of answering "outcome unknown". Nothing here needs the ``mcp`` package.
"""

from __future__ import annotations

__all__ = ["DEDUPLICATES", "IDEMPOTENCY_KEY", "REDELIVERY", "SEP_IDEMPOTENCY_KEY"]

# params._meta[IDEMPOTENCY_KEY]: the caller's key for this call (a string).
IDEMPOTENCY_KEY = "io.oncewire/idempotency-key"
# params._meta[REDELIVERY]: true when an earlier attempt of this call may have run.
REDELIVERY = "io.oncewire/redelivery"
# params.idempotencyKey: the key as the (unmerged) SEP-3182 proposal spells it, read as well.
SEP_IDEMPOTENCY_KEY = "idempotencyKey"
# capabilities.experimental[DEDUPLICATES] = {"version": 1}: every tool of this server runs a
# call once per key (oncewire.mcp.once), so a redelivery is safe.
DEDUPLICATES = "io.oncewire/deduplicates"
