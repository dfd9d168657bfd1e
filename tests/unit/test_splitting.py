"""Splitting replies: properties over generated text, and the boundary preferences."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncewire.core.errors import ConfigurationError
from oncewire.replies.splitting import (
    CLOSE_FENCE,
    Chunk,
    fence_opener,
    measure,
    rejoin,
    split_text,
)

WORDS = st.sampled_from(
    ["alpha", "beta", "γάμμα", "日本語", "😀", "🚀x", "a" * 30, "```", "```py", "`", "x\ty"]
)
SEPARATORS = st.sampled_from([" ", " ", "\n", "\n\n", "\n```\n", "\n```python\n", ""])
TEXT = st.lists(st.tuples(WORDS, SEPARATORS), max_size=120).map(
    lambda pairs: "".join(w + s for w, s in pairs)
)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fences_balanced(text: str) -> bool:
    return fence_opener(text) is None


@SETTINGS
@given(
    text=TEXT,
    cap=st.integers(min_value=24, max_value=200),
    unit=st.sampled_from(["utf16", "codepoints"]),
    reserve=st.sampled_from([0, 3]),
)
def test_chunks_rejoin_fit_and_balance(text: str, cap: int, unit: str, reserve: int) -> None:
    chunks = split_text(text, cap, unit, reserve=reserve)
    assert "".join(c.body for c in chunks) == text
    assert rejoin([c.text for c in chunks]) == text
    for chunk in chunks:
        assert measure(chunk.text, unit) <= cap - reserve
        assert chunk.text or text == ""  # never an empty message for a non-empty text
    # When the text's fences are balanced and repeatable, so is every chunk on its own.
    openers = [line.strip() for line in text.split("\n") if line.lstrip().startswith("```")]
    if _fences_balanced(text) and all(measure(o, unit) < (cap - reserve) // 2 for o in openers):
        for chunk in chunks:
            assert _fences_balanced(chunk.text), chunks


@SETTINGS
@given(text=TEXT, cap=st.integers(min_value=24, max_value=120))
def test_utf16_never_undercounts(text: str, cap: int) -> None:
    for chunk in split_text(text, cap, "utf16"):
        assert len(chunk.text.encode("utf-16-le")) // 2 <= cap


def test_measure_units() -> None:
    assert measure("a😀", "utf16") == 3
    assert measure("a😀", "codepoints") == 2
    assert measure("\ud800x", "utf16") == 2  # a lone surrogate is one unit
    with pytest.raises(ConfigurationError):
        measure("x", "bytes")


def test_prefers_paragraph_then_line_then_word() -> None:
    text = "first paragraph is here\n\nsecond one\nwith lines and words"
    chunks = split_text(text, 40, "codepoints")
    assert chunks[0].body == "first paragraph is here\n\n"
    line = split_text("aaaa bbbb cccc dddd\neeee ffff gggg", 28, "codepoints")
    assert line[0].body == "aaaa bbbb cccc dddd\n"
    word = split_text("aaaa bbbb cccc dddd eeee ffff gggg", 28, "codepoints")
    assert word[0].body == "aaaa bbbb cccc dddd eeee "


def test_a_cut_inside_a_fence_closes_and_reopens_it() -> None:
    code = "\n".join(f"line {n} = {n * n}" for n in range(30))
    text = f"Here is code:\n```python\n{code}\n```\nThat was it."
    chunks = split_text(text, 120, "codepoints")
    assert len(chunks) > 2
    assert chunks[0].close == CLOSE_FENCE
    assert chunks[1].reopen == "```python\n"
    for chunk in chunks:
        assert fence_opener(chunk.text) is None
    assert rejoin([c.text for c in chunks]) == text


def test_telegram_and_discord_caps() -> None:
    long = " ".join(f"word{i:04d}" for i in range(900))
    tg = split_text(long, 4096, "utf16")
    dc = split_text(long, 2000, "codepoints")
    assert len(tg) == 2 and len(dc) == 5
    assert all(len(c.text) <= 2000 for c in dc)


def test_too_small_cap_is_refused() -> None:
    with pytest.raises(ConfigurationError):
        split_text("x" * 100, 10, "codepoints")


def test_chunk_round_trips_through_a_dict() -> None:
    chunk = Chunk("b", reopen="```\n", close=CLOSE_FENCE)
    assert Chunk.from_dict(chunk.as_dict()) == chunk


@SETTINGS
@given(text=TEXT.map(lambda t: t * 40), profile=st.sampled_from(["telegram", "discord", "noedit"]))
def test_the_marker_fits_within_every_chunk(text: str, profile: str) -> None:
    from oncewire.replies import DISCORD_LIKE, NON_EDITABLE, TELEGRAM_LIKE, plan_chunks

    chosen = {"telegram": TELEGRAM_LIKE, "discord": DISCORD_LIKE, "noedit": NON_EDITABLE}[profile]
    for chunk in plan_chunks(text, chosen):
        assert measure(chosen.render(chunk.text, marked=True), chosen.unit) <= chosen.cap
