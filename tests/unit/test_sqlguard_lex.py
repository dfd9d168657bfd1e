"""The one lexer the guard's statement scan and the placeholder translation share reads each
dialect's text as that database does: what one backend quotes the other may not."""

from __future__ import annotations

import pytest

from oncewire.storage.sqlguard import lex, scan


def _kinds(sql: str, postgres: bool) -> list[tuple[str, str]]:
    return [(kind, sql[a:b]) for kind, a, b in lex(sql, postgres) if kind != "space"]


def test_an_escaped_quote_hides_a_semicolon_on_postgresql_only() -> None:
    sql = "SELECT e'\\'; COMMIT; --'"
    assert len(scan(sql, postgres=True)) == 1  # E'...' takes \' as a quote
    second = scan(sql, postgres=False)  # SQLite has no escapes: the literal ends at \'
    assert len(second) == 2 and second[1].word(0) == "COMMIT"


def test_brackets_and_backquotes_quote_on_sqlite_and_not_on_postgresql() -> None:
    assert _kinds("SELECT [a;b]", postgres=False)[1] == ("quoted", "[a;b]")
    assert [k for k, _ in _kinds("SELECT a[1]", postgres=True)] == [
        "word", "word", "other", "other", "other",
    ]  # fmt: skip
    assert _kinds("SELECT `x`", postgres=False)[1] == ("quoted", "`x`")
    assert len(scan("SELECT `;` ", postgres=False)) == 1
    assert len(scan("SELECT `;` ", postgres=True)) == 2


def test_dollar_quotes_are_postgresqls_and_dollar_names_sqlites() -> None:
    assert _kinds("SELECT $q$ ; $q$", postgres=True)[1] == ("dollar", "$q$ ; $q$")
    assert _kinds("SELECT $q", postgres=False)[1] == ("native", "$q")
    assert _kinds("SELECT $1", postgres=True)[1] == ("native", "$1")


@pytest.mark.parametrize("postgres", [False, True])
def test_named_placeholders_casts_and_comments(postgres: bool) -> None:
    kinds = _kinds("SELECT :a::int -- :b\n/* :c */ %s", postgres)
    assert kinds == [
        ("word", "SELECT"),
        ("named", ":a"),
        ("cast", "::"),
        ("word", "int"),
        ("comment", "-- :b\n"),
        ("comment", "/* :c */"),
        ("native", "%s"),
    ]


def test_a_word_is_read_whole_with_its_letters_beyond_ascii() -> None:
    # One identifier to both databases (a syntax error there), not the keyword ROLLBACK.
    assert scan("ROLLBACKé", postgres=True)[0].word(0) == "ROLLBACKÉ"
