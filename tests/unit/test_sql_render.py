"""Every named query renders for both dialects, and the rendering rules hold."""

from __future__ import annotations

import re

import pytest

from oncewire.storage.sql import DIALECTS, QueryError, load, queries


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_query_renders_for_both_dialects(dialect: str) -> None:
    rendered = queries(dialect).all
    assert "claim" in rendered and "reserve_receipt" in rendered
    for name, query in rendered.items():
        text, params = query.render(query.dummy_params())
        assert "{" not in text and "}" not in text, name
        assert not re.search(r"(?<![:\w]):\w", text), f"{name}: a parameter was not rendered"
        placeholder = "?" if dialect == "sqlite" else "%s"
        assert text.count(placeholder) == len(params), name


def test_the_neutral_and_the_postgresql_names_are_the_same() -> None:
    assert set(queries("sqlite").all) == set(queries("postgresql").all)


def test_parameters_become_positional_in_order_of_appearance() -> None:
    files = {"t.sql": "-- name: q\nSELECT x FROM t WHERE a = :a AND b = :b AND c::text = :a"}
    sqlite, pg = load("sqlite", files).q, load("postgresql", files).q
    assert sqlite.render({"a": 1, "b": 2}) == (
        "SELECT x FROM t WHERE a = ? AND b = ? AND c::text = ?",
        (1, 2, 1),
    )
    assert pg.render({"a": 1, "b": 2}) == (
        "SELECT x FROM t WHERE a = %s AND b = %s AND c::text = %s",
        (1, 2, 1),
    )


def test_a_literal_percent_is_doubled_for_postgresql_only() -> None:
    files = {"t.sql": "-- name: q\nSELECT x FROM t WHERE k LIKE 'a%' AND y = :y"}
    assert load("postgresql", files).q.render({"y": 1})[0].endswith("LIKE 'a%%' AND y = %s")
    assert load("sqlite", files).q.render({"y": 1})[0].endswith("LIKE 'a%' AND y = ?")


def test_in_lists_expand_on_sqlite_and_bind_one_array_on_postgresql() -> None:
    files = {"t.sql": "-- name: q\nSELECT x FROM t WHERE k {in :ks} AND y = :y"}
    sqlite, pg = load("sqlite", files).q, load("postgresql", files).q
    assert sqlite.render({"ks": ["a", "b"], "y": 3}) == (
        "SELECT x FROM t WHERE k IN (?, ?) AND y = ?",
        ("a", "b", 3),
    )
    # An empty list matches nothing.
    assert sqlite.render({"ks": [], "y": 3}) == (
        "SELECT x FROM t WHERE k IN (NULL) AND y = ?",
        (3,),
    )
    assert pg.render({"ks": ("a", "b"), "y": 3}) == (
        "SELECT x FROM t WHERE k = ANY(%s) AND y = %s",
        (["a", "b"], 3),
    )
    assert pg.render({"ks": [], "y": 3}) == (
        "SELECT x FROM t WHERE k = ANY(%s) AND y = %s",
        ([], 3),
    )
    # One value is looked up as one: a cached plan for = ANY of an unknown length may filter.
    assert pg.render({"ks": ["a"], "y": 3}) == ("SELECT x FROM t WHERE k = %s AND y = %s", ("a", 3))
    assert pg.render({"ks": ("a", "b"), "y": 4})[0].endswith("= ANY(%s) AND y = %s")


def test_values_pad_to_a_power_of_two_on_sqlite_and_unnest_on_postgresql() -> None:
    files = {"t.sql": "-- name: q\nWITH v (a, b) AS ({values :rows bigint, text}) SELECT * FROM v"}
    sqlite, pg = load("sqlite", files).q, load("postgresql", files).q
    text, params = sqlite.render({"rows": [(1, "x"), (2, "y"), (3, "z")]})
    assert text == "WITH v (a, b) AS (VALUES (?, ?), (?, ?), (?, ?), (?, ?)) SELECT * FROM v"
    assert params == (1, "x", 2, "y", 3, "z", None, None)
    text, params = pg.render({"rows": [(1, "x"), (2, "y")]})
    assert (
        text == "WITH v (a, b) AS (SELECT * FROM unnest(%s::bigint[], %s::text[])) SELECT * FROM v"
    )
    assert params == ([1, 2], ["x", "y"])


def test_locks_and_column_lists() -> None:
    files = {
        "t.sql": "-- name: q\nSELECT {receipt_columns}, {effect_columns:e} FROM t AS e "
        "{for_update}\n-- name: r\nSELECT id FROM t {skip_locked}"
    }
    sqlite, pg = load("sqlite", files), load("postgresql", files)
    assert sqlite.q.render({})[0].startswith("SELECT key, digest, payload, result")
    assert "e.id, e.key, e.kind" in sqlite.q.render({})[0]
    assert sqlite.q.render({})[0].rstrip().endswith("FROM t AS e")
    assert pg.q.render({})[0].endswith("FROM t AS e FOR UPDATE")
    assert sqlite.r.render({})[0].rstrip() == "SELECT id FROM t"
    assert pg.r.render({})[0] == "SELECT id FROM t FOR UPDATE SKIP LOCKED"


def test_an_override_replaces_the_neutral_query_on_its_dialect_only() -> None:
    files = {
        "t.sql": "-- name: q\nSELECT 1",
        "postgresql.sql": "-- name: q [postgresql]\nSELECT 2",
    }
    assert load("sqlite", files).q.render({})[0] == "SELECT 1"
    assert load("postgresql", files).q.render({})[0] == "SELECT 2"


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"postgresql.sql": "-- name: q [postgresql]\nSELECT 2"}, "no neutral query"),
        ({"t.sql": "-- name: q\nSELECT 1", "postgresql.sql": "-- name: q\nSELECT 2"}, "marked"),
        ({"t.sql": "-- name: q [postgresql]\nSELECT 1"}, "belongs in postgresql.sql"),
        ({"t.sql": "-- name: q\nSELECT 1", "u.sql": "-- name: q\nSELECT 2"}, "defined twice"),
        ({"t.sql": "-- name: q [mysql]\nSELECT 1"}, "unknown dialect"),
        ({"t.sql": "SELECT 1"}, "before the first"),
        ({"t.sql": "-- name: q\n-- only a comment"}, "no statement"),
        ({"t.sql": "-- name: q\nSELECT {nonsense}"}, "unknown macro"),
    ],
)
def test_the_loader_refuses_what_it_cannot_use(files: dict[str, str], message: str) -> None:
    with pytest.raises(QueryError, match=message):
        load("sqlite", files)
        load("postgresql", files)


def test_an_unknown_query_is_named() -> None:
    with pytest.raises(AttributeError, match="no_such_query"):
        _ = queries("sqlite").no_such_query
