"""``oncewire ui``: a local web dashboard over a store, read-only unless told otherwise.

Server-rendered pages (Starlette, Jinja2 templates shipped with the package, charts drawn as
inline SVG on the server) over the same readers the command line uses: effects and their
attempt history, receipts, inbound chat messages and their replies' wire operations, runs with
their verification verdict, and a crash lab's evidence file. Pages refresh their data in place
by fetching their own content again, every two seconds unless ``--refresh-seconds`` says
otherwise (:mod:`oncewire.ui.period`).

Retry and cancel are the only writes, through the same verbs as ``oncewire effects retry`` and
``cancel``, and only when the server was started with ``--allow-actions``; each one carries the
server's CSRF token. Binding beyond loopback requires a token (see :mod:`oncewire.ui.guard`).

Needs the ``ui`` extra (``pip install 'oncewire[ui]'``). Importing this package does not; without
the extra, importing any of its modules but :mod:`~oncewire.ui.period` raises
:class:`oncewire.errors.MissingExtra`.
"""

from __future__ import annotations

__all__: list[str] = []
