"""The previewer: one short-lived thread per streaming reply, showing the model's newest text.

The turn worker reads the model stream and hands each new text to :meth:`Previewer.show`,
which only stores it and wakes the thread: the worker never waits on the platform. The thread
previews the newest text it holds through the reply engine (:meth:`ReplyEngine.preview`, each
operation written ``in_flight`` under the record's lease) at most once per
``edit_interval_seconds``, or later when the platform asked for a wait, so the texts in between
are coalesced.

When the stream ends the worker commits the answer *without* waiting for the previewer (a
preview parked on a slow platform holds no database lock, so the commit goes through), then
calls :meth:`Previewer.stop`, which joins the thread for at most ``join_seconds``; only then
does the worker deliver. Once the answer is committed a preview does nothing, so the final
delivery is the only writer of the screen from then on.
"""

from __future__ import annotations

import logging
import threading
import time

from oncewire.gateway.outage import store_away
from oncewire.replies import ReplyEngine

__all__ = ["Previewer"]

log = logging.getLogger("oncewire.gateway.preview")


class Previewer:
    """Previews one reply from a thread of its own; :meth:`show` never blocks."""

    def __init__(
        self,
        engine: ReplyEngine,
        reply_id: int,
        *,
        edit_interval_seconds: float,
        name: str = "previewer",
    ) -> None:
        self.engine = engine
        self.reply_id = reply_id
        self.edit_interval_seconds = edit_interval_seconds
        self._cond = threading.Condition()
        self._text = ""
        self._shown = ""
        self._stopped = False
        self._in_flight = False  # an engine.preview call (a wire operation) is under way
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Previewer:
        self._thread.start()
        return self

    def show(self, text: str) -> None:
        """The answer so far; the thread previews the newest text it was given."""
        with self._cond:
            self._text = text
            self._cond.notify()

    def stop(self, join_seconds: float) -> bool:
        """No more previews; wait up to ``join_seconds`` for one in progress. True when the
        thread ended (False: an operation is still parked on the platform; its outcome is
        recorded whenever the platform answers, and the delivery repairs the screen)."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(join_seconds)
        return not self._thread.is_alive()

    @property
    def in_flight(self) -> bool:
        """True while a preview operation is under way (it may be parked on the platform)."""
        return self._in_flight

    def _run(self) -> None:
        next_at = 0.0
        while True:
            with self._cond:
                while not self._stopped and self._text == self._shown:
                    self._cond.wait()
                if self._stopped:
                    return
                delay = next_at - time.monotonic()
                if delay > 0:
                    # Rate the previews; a stop or newer text during the wait is taken after it.
                    self._cond.wait(delay)
                    if self._stopped:
                        return
                text = self._text
            self._in_flight = True
            try:
                result = self.engine.preview(self.reply_id, text)
            except Exception as exc:
                # A preview is a courtesy: the committed answer's delivery repairs the screen.
                if store_away(exc):  # the store is away: the loops' outage lines say so
                    log.warning("preview of reply %s stopped: %s", self.reply_id, exc)
                else:
                    log.exception("preview of reply %s failed; previews stop", self.reply_id)
                return
            finally:
                self._in_flight = False
            if not result.previewing:
                return
            self._shown = text
            next_at = time.monotonic() + max(self.edit_interval_seconds, result.wait_seconds)
