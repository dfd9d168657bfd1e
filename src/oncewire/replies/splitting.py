"""Splitting a reply into chunks that fit a platform's cap, in the platform's own units.

Telegram counts UTF-16 code units (an emoji outside the Basic Multilingual Plane costs two);
Discord-like platforms count code points. A chunk ends, by preference, at a paragraph break,
then a line break, then a space, and only as a last resort anywhere (never right after a
backtick run, so an added fence cannot be confused with a real one and no
backtick run is moved to the start of a line). A cut inside a code fence
closes the fence at the end of the chunk and reopens it, with its info string, at the start of
the next, so every chunk renders as balanced markdown.

The bodies of the chunks, joined, are the text exactly; :func:`rejoin` recovers the text from
the rendered chunks (what a platform shows) by removing the fences the splitter added.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from oncewire.core.errors import ConfigurationError

__all__ = [
    "CLOSE_FENCE",
    "UNITS",
    "Chunk",
    "fence_opener",
    "measure",
    "rejoin",
    "split_text",
]

UNITS = ("utf16", "codepoints")
FENCE = "```"
CLOSE_FENCE = "\n" + FENCE  # what the splitter appends to a chunk that ends inside a fence


def measure(text: str, unit: str) -> int:
    """The length of ``text`` in ``unit``: ``utf16`` code units or ``codepoints``."""
    if unit == "codepoints":
        return len(text)
    if unit == "utf16":
        # A lone surrogate counts as one unit, as it would in the platform's own string.
        return len(text.encode("utf-16-le", "surrogatepass")) // 2
    raise ConfigurationError(f"unknown unit {unit!r} (one of: {', '.join(UNITS)})")


@dataclass(frozen=True, slots=True)
class Chunk:
    """One message's worth of a reply: ``reopen + body + close`` is what the platform shows."""

    body: str
    reopen: str = ""  # the fence opener line (and newline) added before the body
    close: str = ""  # the fence closer added after the body

    @property
    def text(self) -> str:
        return self.reopen + self.body + self.close

    def as_dict(self) -> dict[str, str]:
        return {"body": self.body, "reopen": self.reopen, "close": self.close}

    @classmethod
    def from_dict(cls, value: dict[str, str]) -> Chunk:
        return cls(body=value["body"], reopen=value.get("reopen", ""), close=value.get("close", ""))


def fence_opener(text: str) -> str | None:
    """The opening line of the code fence still open at the end of ``text``, or None."""
    opener: str | None = None
    for line in text.split("\n"):
        if line.lstrip().startswith(FENCE):
            opener = None if opener is not None else line.strip()
    return opener


def _boundary(text: str, start: int, limit: int) -> int:
    """Where to end a chunk that starts at ``start`` and may not go past ``limit``."""
    window = text[start:limit]
    half = len(window) // 2
    for separator in ("\n\n", "\n"):
        at = window.rfind(separator)
        if at >= half and at > 0:
            return start + at + len(separator)
    for at in range(len(window) - 1, 0, -1):
        if window[at].isspace() and not _leads_to_backticks(text, start + at + 1):
            return start + at + 1
    positions = range(limit, start, -1)
    for end in positions:  # a hard cut does not end in a backtick run either
        if text[end - 1] != "`" and not _leads_to_backticks(text, end):
            return end
    for end in positions:  # backticks everywhere: at least keep fence lines whole
        if not _leads_to_backticks(text, end) and not _in_fence_line(text, end):
            return end
    return limit


def _in_fence_line(text: str, end: int) -> bool:
    """Does a cut at ``end`` fall inside (or at the end of) a fence line?"""
    line_start = text.rfind("\n", 0, end) + 1
    return text[line_start:end].lstrip().startswith(FENCE)


def _leads_to_backticks(text: str, end: int) -> bool:
    """Would a cut at ``end`` start the next chunk's first line with a fence?"""
    if end > 0 and text[end - 1] == "\n":
        return False  # the line starts there in the text too
    while end < len(text) and text[end] in " \t":
        end += 1
    return text.startswith(FENCE, end)


def _fit(text: str, start: int, budget: int, unit: str) -> int:
    """The largest end such that ``text[start:end]`` measures at most ``budget`` (>= start+1)."""
    high = min(len(text), start + max(1, budget))  # every code point costs at least one unit
    if unit == "codepoints" or measure(text[start:high], unit) <= budget:
        return high
    low = start  # the length in units only grows with the end: search for the largest fit
    while high - low > 1:
        middle = (low + high) // 2
        if measure(text[start:middle], unit) <= budget:
            low = middle
        else:
            high = middle
    return max(low, start + 1)


def _open_fence(text: str, end: int) -> str | None:
    """The full opener line of the fence that a cut at ``end`` would fall inside, or None.

    A cut inside the opener line itself counts as inside the fence: the chunk then closes the
    fence right after its partial opener, and the next chunk repeats the whole opener line.
    """
    opener: str | None = None
    offset = 0
    for line in text.split("\n"):
        if offset >= end:
            break
        if line.lstrip().startswith(FENCE):
            opener = None if opener is not None else line.strip()
        offset += len(line) + 1
    return opener


def split_text(text: str, cap: int, unit: str, *, reserve: int = 0) -> list[Chunk]:
    """Split ``text`` into chunks whose rendered text measures at most ``cap - reserve``.

    ``reserve`` keeps room in every chunk for what an adapter may add (the duplicate marker).
    An empty text is one empty chunk. A fence whose opener line is longer than half the budget
    cannot be repeated; a cut inside such a fence is made without closing and reopening it.
    """
    budget = cap - reserve
    close_cost = measure(CLOSE_FENCE, unit)
    if budget < close_cost + 8:
        raise ConfigurationError(f"a cap of {cap} ({reserve} reserved) is too small to split")
    if measure(text, unit) <= budget:
        return [Chunk(text)]

    def repeatable(opener: str | None) -> str | None:
        return opener if opener is not None and measure(opener, unit) < budget // 2 else None

    chunks: list[Chunk] = []
    start, reopen = 0, ""
    while start < len(text):
        room = budget - measure(reopen, unit)
        rest = text[start:]
        if measure(rest, unit) <= room:
            chunks.append(Chunk(rest, reopen=reopen))
            break
        end = _boundary(text, start, _fit(text, start, room, unit))
        opener = repeatable(_open_fence(text, end))
        if opener is not None:  # the chunk will need a closer: leave room for it
            end = _boundary(text, start, _fit(text, start, room - close_cost, unit))
            opener = repeatable(_open_fence(text, end))
        chunks.append(Chunk(text[start:end], reopen=reopen, close=CLOSE_FENCE if opener else ""))
        reopen = opener + "\n" if opener else ""
        start = end
    return chunks


def rejoin(texts: Sequence[str]) -> str:
    """The original text from rendered chunk texts (as the platform shows them, unmarked)."""
    out: list[str] = []
    so_far = ""
    reopened = False
    for index, text in enumerate(texts):
        if reopened:
            text = text.split("\n", 1)[1] if "\n" in text else ""
        last = index == len(texts) - 1
        reopened = False
        if not last and text.endswith(CLOSE_FENCE):
            body = text[: -len(CLOSE_FENCE)]
            if fence_opener(so_far + body) is not None:
                text, reopened = body, True
        out.append(text)
        so_far += text
    return "".join(out)
