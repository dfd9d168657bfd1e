"""What the caller's ``tx.execute`` may run inside a transaction oncewire shares with it.

The caller's rows and oncewire's rows commit together only if the caller's SQL leaves the
transaction open: a ``COMMIT`` in the middle would commit the caller's rows and let oncewire's
later rows autocommit one by one, a ``ROLLBACK`` would drop what oncewire wrote so far while the
caller goes on. So ``tx.execute`` refuses, before anything runs:

- transaction control: BEGIN, START TRANSACTION, COMMIT, END, ROLLBACK, ABORT,
  PREPARE TRANSACTION, COMMIT/ROLLBACK PREPARED, SET TRANSACTION, SET SESSION CHARACTERISTICS;
- what changes the connection oncewire keeps using after the transaction: a session-level
  ``SET``, RESET, DISCARD, DEALLOCATE, LISTEN, a PRAGMA that assigns a setting
  (``journal_mode``, ``synchronous``, ...), ATTACH and DETACH;
- ``SET LOCAL`` of a setting oncewire's own statements and its commit rely on
  (:data:`RELIED_ON_SETTINGS`: ``synchronous_commit`` off locally would make the shared commit
  itself non-durable); ``SET LOCAL`` of any other setting ends with the transaction and is
  allowed;
- COPY (its data would travel on the connection outside the statement, which leaves it unusable);
- VACUUM (neither database runs it inside a transaction);
- several statements in one string (SQLite's driver refuses them already; psycopg would run
  them, so a ``COMMIT`` could hide behind a first statement).

Savepoints are allowed when they are the caller's own: ``SAVEPOINT x`` and then
``RELEASE x`` / ``ROLLBACK TO x`` nest inside the outer transaction on both databases and never
end it. Releasing or rolling back to a savepoint the caller did not create through this
transaction (one oncewire opened, or none at all) is refused: rolling back to oncewire's own
savepoint would undo a reservation oncewire goes on relying on.

The scan is a small lexer (:func:`lex`, one for both uses below), not a parser: it reads the
text as the database of its dialect does, skips comments, string literals, quoted identifiers
and PostgreSQL dollar quotes, splits at top-level semicolons, and looks at the first words of
each statement. It is the first refusal, with the clearest message, and it is not what
keeps the promise: a text it reads otherwise than the database does (SQLite skips a leading
U+FEFF; a ``SELECT`` can call PostgreSQL's ``set_config``) is refused by the database's own
reading of it, :mod:`oncewire.storage.sqlite.guard` (SQLite's authorizer) and
:mod:`oncewire.storage.postgres.guard` (PostgreSQL's settings, read after every statement).

The same lexing makes the caller's SQL portable (:func:`caller_statement`): ``:name``
placeholders with a dict of values run on SQLite as written and on PostgreSQL translated to
psycopg's ``%(name)s``; positional values and each driver's own placeholders are refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from oncewire.core.errors import InvalidState, StatementError

__all__ = [
    "PORTABLE_STYLE",
    "RELIED_ON_SETTINGS",
    "SavepointOp",
    "SavepointStack",
    "Statement",
    "caller_statement",
    "check_statement",
    "lex",
    "refused",
    "scan",
]

_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")
_FIRST = re.compile(r"\s*([A-Za-z]+)")
_TOKENS_KEPT = 8  # the first words of a statement are all a rule looks at

# Words that open a statement the scan must look at closely; any other first word (SELECT,
# INSERT, UPDATE, DELETE, WITH, CREATE, ...) on a string with no ';' and no comment is allowed
# without lexing it: the hot path of a caller's INSERT.
_WATCHED = frozenset(
    {
        "ABORT",
        "ATTACH",
        "BEGIN",
        "COMMIT",
        "COPY",
        "DEALLOCATE",
        "DETACH",
        "DISCARD",
        "END",
        "LISTEN",
        "PRAGMA",
        "PREPARE",
        "RELEASE",
        "RESET",
        "ROLLBACK",
        "SAVEPOINT",
        "SET",
        "START",
        "VACUUM",
    }
)
# PRAGMAs that only read, and take an argument in parentheses.
_READING_PRAGMAS = frozenset(
    {
        "table_info",
        "table_xinfo",
        "table_list",
        "index_info",
        "index_xinfo",
        "index_list",
        "foreign_key_list",
        "foreign_key_check",
        "integrity_check",
        "quick_check",
    }
)


# PostgreSQL settings oncewire's own statements, its commit and its driver rely on. Changed in a
# shared transaction (even locally: synchronous_commit off for the one commit that carries the
# caller's rows and the intent), the whole transaction is rolled back.
RELIED_ON_SETTINGS = (
    "synchronous_commit",  # the commit is durable when it returns
    "search_path",  # oncewire's statements name its tables without a schema
    "default_transaction_isolation",
    "default_transaction_read_only",
    "default_transaction_deferrable",
    "transaction_isolation",
    "transaction_read_only",
    "statement_timeout",  # a statement of oncewire's is not cut short
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "idle_session_timeout",  # the pooled connection is not closed under oncewire
    "role",  # oncewire's statements run as the store's user
    "session_authorization",
    "session_replication_role",  # "replica" would switch off oncewire's triggers and keys
    "client_encoding",  # psycopg decodes every text with it
    "standard_conforming_strings",
    "extra_float_digits",  # times are floats, read back as text
)
# Words after SET [LOCAL] that name a relied-on setting under another name.
_SET_ALIASES = {"SCHEMA": "search_path", "NAMES": "client_encoding"}

# What the caller's savepoint statement does, as SQLite's authorizer names it: ("BEGIN" |
# "RELEASE" | "ROLLBACK", the savepoint's name).
SavepointOp = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Token:
    text: str  # a word as written, a quoted identifier's content, or one punctuation char
    word: bool  # an unquoted word (keywords are compared upper-cased)
    quoted: bool = False


@dataclass(frozen=True, slots=True)
class Statement:
    """The first tokens of one statement of a caller's SQL."""

    tokens: tuple[Token, ...]

    def word(self, index: int) -> str:
        if index < len(self.tokens) and self.tokens[index].word:
            return self.tokens[index].text.upper()
        return ""


# The kinds of span the lexer yields: what the scan and the placeholder translation tell apart.
SPACE, COMMENT, END_OF_STATEMENT, STRING, QUOTED, DOLLAR, WORD, NAMED, CAST, NATIVE, OTHER = (
    "space", "comment", ";", "string", "quoted", "dollar", "word", "named", "cast", "native",
    "other",
)  # fmt: skip


def lex(sql: str, postgres: bool) -> Iterator[tuple[str, int, int]]:
    """The spans of ``sql`` as the database of that dialect reads them: ``(kind, start, end)``.

    Comments (``--`` and ``/* */``, which PostgreSQL nests), string literals (``'...'``, and on
    PostgreSQL ``E'...'`` with its backslash escapes), quoted identifiers (``"..."``; on SQLite
    also ``[...]`` and backquotes), PostgreSQL's dollar quotes, words, ``:name`` placeholders
    (a ``::`` cast is not one), a placeholder of a driver's own style (psycopg's ``%s`` on both;
    SQLite's ``?``, ``?NNN``, ``$name``, ``@name``; PostgreSQL's ``$1``) and any other single
    character. On PostgreSQL ``[`` is an array subscript and ``?`` an operator.
    """
    native = _POSTGRES_NATIVE if postgres else _SQLITE_NATIVE
    word = _pg_word()
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        start = i
        if ch.isspace():
            i += 1
            kind = SPACE
        elif ch == "-" and sql.startswith("--", i):
            end = sql.find("\n", i)
            i, kind = (n if end < 0 else end + 1), COMMENT
        elif ch == "/" and sql.startswith("/*", i):
            i, kind = _skip_block_comment(sql, i), COMMENT
        elif ch == ";":
            i, kind = i + 1, END_OF_STATEMENT
        elif ch == "'":
            escapes = postgres and i > 0 and sql[i - 1] in "eE"
            escapes = escapes and (i < 2 or not _is_word_char(sql[i - 2]))
            i, kind = _skip_string(sql, i, "'", backslash=escapes), STRING
        elif ch == '"' or (ch == "`" and not postgres):
            i, kind = _skip_string(sql, i, ch, backslash=False), QUOTED
        elif ch == "[" and not postgres:
            i, kind = _skip_string(sql, i, "]", backslash=False), QUOTED
        elif ch == "$" and postgres and (match := _DOLLAR.match(sql, i)) is not None:
            end = sql.find(match.group(0), match.end())
            i, kind = (n if end < 0 else end + len(match.group(0))), DOLLAR
        elif ch == ":" and sql.startswith("::", i):
            i, kind = i + 2, CAST  # the type name after it is a word
        elif ch == ":" and (match := _NAME.match(sql, i + 1)) is not None:
            i, kind = match.end(), NAMED
        elif ch in "%?$@" and (match := (_PYFORMAT if ch == "%" else native).match(sql, i)):
            i, kind = match.end(), NATIVE
        elif (match := word.match(sql, i)) is not None:
            i, kind = match.end(), WORD  # a word, so that a '$' inside it opens no dollar quote
        else:
            i, kind = i + 1, OTHER
        yield kind, start, i


def scan(sql: str, postgres: bool) -> list[Statement]:
    """The non-empty statements of ``sql``, each with its first few tokens."""
    statements: list[Statement] = []
    tokens: list[Token] = []
    non_empty = False
    # A SQLite trigger's body (CREATE TRIGGER ... BEGIN stmt; stmt; END) is one statement: its
    # semicolons sit inside BEGIN ... END, where CASE ... END may nest too.
    first_words: list[str] = []
    body_depth = 0
    for kind, start, end in lex(sql, postgres):
        if kind in (SPACE, COMMENT):
            continue
        if kind == END_OF_STATEMENT:
            if body_depth > 0:
                continue
            if non_empty:
                statements.append(Statement(tuple(tokens)))
            tokens, non_empty, first_words = [], False, []
            continue
        non_empty = True
        if len(tokens) >= _TOKENS_KEPT and kind != WORD:
            continue
        text = sql[start:end]
        if kind == QUOTED:
            close = "]" if text[0] == "[" else text[0]
            content = text[1:-1] if text.endswith(close) and len(text) > 1 else text[1:]
            token = Token(content.replace(close * 2, close), word=False, quoted=True)
        elif kind == WORD:
            token = Token(text, word=True)
            upper = text.upper()
            if len(first_words) < 3:
                first_words.append(upper)
            elif first_words[0] == "CREATE" and "TRIGGER" in first_words[1:]:
                if upper == "BEGIN" or (upper == "CASE" and body_depth > 0):
                    body_depth += 1
                elif upper == "END" and body_depth > 0:
                    body_depth -= 1
        else:
            token = Token(text[0], word=False)  # a literal, a quote, a placeholder: its opener
        if len(tokens) < _TOKENS_KEPT:
            tokens.append(token)
    if non_empty:
        statements.append(Statement(tuple(tokens)))
    return statements


def _is_word_char(ch: str) -> bool:
    return ch.isalnum() or ch in "_$"


def _skip_block_comment(sql: str, i: int) -> int:
    # PostgreSQL nests block comments; SQLite does not, but a nested opener inside a SQLite
    # comment only makes this scan see more comment, never less of the statement after it.
    depth, i, n = 0, i, len(sql)
    while i < n:
        if sql.startswith("/*", i):
            depth += 1
            i += 2
        elif sql.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    return n


def _skip_string(sql: str, i: int, close: str, *, backslash: bool) -> int:
    """The index just past the literal opened at ``i`` (doubled ``close`` is an escape)."""
    i += 1
    n = len(sql)
    while i < n:
        ch = sql[i]
        if backslash and ch == "\\":
            i += 2
            continue
        if ch == close:
            if i + 1 < n and sql[i + 1] == close:
                i += 2
                continue
            return i + 1
        i += 1
    return n


def _savepoint_name(token: Token | None) -> str | None:
    if token is None:
        return None
    if token.quoted:
        return token.text
    return token.text.lower() if token.word else None


class SavepointStack:
    """The savepoints open in one transaction, and who opened each (the caller or oncewire)."""

    __slots__ = ("_open",)

    def __init__(self) -> None:
        self._open: list[tuple[str, bool]] = []  # (name, opened by the caller), oldest first

    def opened(self, name: str, *, by_caller: bool) -> None:
        self._open.append((name, by_caller))

    def state(self) -> list[tuple[str, bool]]:
        """What :meth:`restore` puts back (a statement the database did not run)."""
        return list(self._open)

    def restore(self, state: list[tuple[str, bool]]) -> None:
        self._open = state

    def check(self, name: str, verb: str) -> int:
        """Where the caller's ``verb`` (RELEASE / ROLLBACK TO) of ``name`` applies, or refuse."""
        for index in range(len(self._open) - 1, -1, -1):
            open_name, by_caller = self._open[index]
            if open_name == name:
                if by_caller:
                    return index
                break
            if not by_caller:
                break  # the caller's savepoint is below one of oncewire's: leave it alone
        raise InvalidState(
            f"{verb} {name!r} refused: only a savepoint this transaction's caller opened (and "
            "that no savepoint of oncewire's sits above) may be released or rolled back to; "
            "nothing was executed"
        )

    def released(self, name: str) -> None:
        """``RELEASE name``: it and every savepoint opened after it are gone."""
        for index in range(len(self._open) - 1, -1, -1):
            if self._open[index][0] == name:
                del self._open[index:]
                return

    def rolled_back_to(self, name: str) -> None:
        """``ROLLBACK TO name``: it stays open; every savepoint opened after it is gone."""
        for index in range(len(self._open) - 1, -1, -1):
            if self._open[index][0] == name:
                del self._open[index + 1 :]
                return


def refused(what: str, why: str) -> InvalidState:
    """The refusal of a caller's statement that did not run."""
    return InvalidState(
        f"{what} is not allowed in a transaction shared with oncewire ({why}); nothing was "
        "executed. Leave the with block normally to commit, or raise to roll back."
    )


def check_statement(sql: str, savepoints: SavepointStack, dialect: str) -> SavepointOp | None:
    """Refuse ``sql`` (InvalidState, before it runs) if it could end or escape the transaction,
    read as the database of ``dialect`` reads it.

    A savepoint statement the caller may run is recorded in ``savepoints``, and what it does is
    returned, for the database's own check that it reads the statement the same way.
    """
    if ";" not in sql and "--" not in sql and "/*" not in sql:
        first = _FIRST.match(sql)
        if first is None or first.group(1).upper() not in _WATCHED:
            return None  # the common case: a plain statement with no comment and no separator
    statements = scan(sql, dialect == "postgresql")
    if len(statements) > 1:
        raise refused(
            "more than one statement in one execute",
            "run them one execute at a time, as SQLite's driver requires",
        )
    return _check_one(statements[0], savepoints) if statements else None


def _check_one(statement: Statement, savepoints: SavepointStack) -> SavepointOp | None:
    first = statement.word(0)
    if first in ("BEGIN", "COMMIT", "END", "ABORT") or (
        first == "START" and statement.word(1) == "TRANSACTION"
    ):
        raise refused(first, "it would end or restart the shared transaction")
    if first == "PREPARE" and statement.word(1) == "TRANSACTION":
        raise refused("PREPARE TRANSACTION", "it would end the shared transaction")
    if first == "ROLLBACK":
        index = 1
        if statement.word(index) in ("WORK", "TRANSACTION"):
            index += 1
        if statement.word(index) != "TO":
            raise refused("ROLLBACK", "it would end the shared transaction")
        index += 1
        if statement.word(index) == "SAVEPOINT":
            index += 1
        name = _savepoint_name(_token(statement, index))
        if name is None:
            raise refused("ROLLBACK TO without a savepoint name", "it could not be checked")
        savepoints.check(name, "ROLLBACK TO")
        savepoints.rolled_back_to(name)
        return ("ROLLBACK", name)
    if first == "RELEASE":
        index = 2 if statement.word(1) == "SAVEPOINT" else 1
        name = _savepoint_name(_token(statement, index))
        if name is None:
            raise refused("RELEASE without a savepoint name", "it could not be checked")
        savepoints.check(name, "RELEASE")
        savepoints.released(name)
        return ("RELEASE", name)
    if first == "SAVEPOINT":
        name = _savepoint_name(_token(statement, 1))
        if name is None:
            return None
        savepoints.opened(name, by_caller=True)
        return ("BEGIN", name)
    if first == "SET":
        second = statement.word(1)
        if second == "CONSTRAINTS":
            return None  # ends with the transaction
        if second == "LOCAL":
            _check_set_local(statement)
            return None
        if second in ("TRANSACTION", "SESSION"):
            raise refused(f"SET {second}", "it changes the shared transaction or the session")
        raise refused(
            "a session-level SET",
            "it outlives the transaction on the connection oncewire goes on using; SET LOCAL "
            "is allowed",
        )
    if first in ("RESET", "DISCARD", "DEALLOCATE", "LISTEN"):
        raise refused(first, "it changes the connection oncewire goes on using")
    if first == "COPY":
        raise refused(
            "COPY",
            "its data would travel on the connection outside the statement, which leaves the "
            "connection unusable",
        )
    if first in ("ATTACH", "DETACH"):
        raise refused(first, "it changes the connection oncewire goes on using")
    if first == "VACUUM":
        raise refused("VACUUM", "it cannot run inside a transaction")
    if first == "PRAGMA":
        _check_pragma(statement)
    return None


def _check_set_local(statement: Statement) -> None:
    # SET LOCAL name { TO | = } value, SET LOCAL ROLE r, SET LOCAL SESSION AUTHORIZATION u, ...
    token = _token(statement, 2)
    if token is None or not (token.word or token.quoted):
        return  # not a SET the database would run
    word = token.text.upper()
    if token.word and word == "TRANSACTION":
        raise refused("SET LOCAL TRANSACTION", "it changes the shared transaction")
    if token.word and word == "SESSION" and statement.word(3) == "AUTHORIZATION":
        name = "session_authorization"
    elif token.word and word in _SET_ALIASES:
        name = _SET_ALIASES[word]
    else:
        name = token.text.lower()
    if name in RELIED_ON_SETTINGS:
        raise refused(
            f"SET LOCAL {name}",
            "oncewire's own statements and the shared commit rely on it; the transaction would "
            "be rolled back at the end of the block",
        )


def _token(statement: Statement, index: int) -> Token | None:
    return statement.tokens[index] if index < len(statement.tokens) else None


def _check_pragma(statement: Statement) -> None:
    # PRAGMA [schema.]name [= value | (value)]
    tokens = statement.tokens
    index = 1
    if len(tokens) > index + 1 and tokens[index + 1].text == ".":
        index += 2
    name_token = _token(statement, index)
    name = name_token.text.lower() if name_token is not None else ""
    after = _token(statement, index + 1)
    if after is None:
        return  # reading a setting
    if after.text == "=" or (after.text == "(" and name not in _READING_PRAGMAS):
        raise refused(
            f"PRAGMA {name} with a value",
            "it changes a setting of the connection oncewire goes on using",
        )


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Placeholders of one driver's own style, which would run on that backend alone: psycopg's
# %s and %(name)s (both backends: outside a literal, '%' then 's' is nothing else a statement
# means; write a modulo by a column named s as 'a % s'), SQLite's ?, ?NNN, $name and @name, and
# PostgreSQL's $1, which would silently take the value of the first translated :name.
_PYFORMAT = re.compile(r"%(?:\([A-Za-z_][A-Za-z0-9_]*\))?s(?![A-Za-z0-9_$])")
_SQLITE_NATIVE = re.compile(r"\?[0-9]*|[$@][A-Za-z0-9_]+")
_POSTGRES_NATIVE = re.compile(r"\$[0-9]+")
_NATIVE_OWNER = {"%": "psycopg", "?": "SQLite", "@": "SQLite"}

PORTABLE_STYLE = (
    ":name placeholders with a dict (the one style that runs on SQLite and PostgreSQL alike: "
    "VALUES (:id, :total) with {'id': ..., 'total': ...})"
)


@lru_cache(maxsize=1)
def _pg_word() -> re.Pattern[str]:
    """A PostgreSQL word, compiled on first use: the wide character range takes ~20 ms to
    compile, which every process that imports the store paid, PostgreSQL or not."""
    return re.compile(r"[A-Za-z_\u0080-\uffff][A-Za-z0-9_$\u0080-\uffff]*")


def caller_statement(
    sql: str, params: Sequence[Any] | Mapping[str, Any] | None, dialect: str
) -> tuple[str, Mapping[str, Any] | None]:
    """The caller's ``tx.execute(sql, params)`` as the driver of ``dialect`` takes it: the text
    and its dict of values (None when there are none).

    One style runs on both backends: ``:name`` placeholders with a dict. SQLite takes the text
    as written; PostgreSQL gets psycopg's ``%(name)s``, with every ``%`` doubled once values go
    with it (psycopg reads ``%`` anywhere, even in a literal). Positional values (a tuple or a
    list), or a placeholder of one driver's own style outside literals, quoted identifiers and
    comments, are a :class:`StatementError` naming the portable style, before anything runs:
    they would run on one backend and not on the other.
    """
    values: Mapping[str, Any] | None
    if params is None or isinstance(params, Mapping):
        values = params or None
    elif isinstance(params, str | bytes) or not isinstance(params, Sequence):
        raise StatementError(
            f"tx.execute takes its values as a dict, not {type(params).__name__}: "
            f"{PORTABLE_STYLE}; nothing was run"
        )
    elif len(params) > 0:
        raise StatementError(
            f"tx.execute takes {PORTABLE_STYLE}, not positional values in a "
            f"{type(params).__name__} (? is SQLite's own, %s psycopg's); nothing was run"
        )
    else:
        values = None
    text, native = _rendered(sql, dialect == "postgresql")
    if native is not None:
        owner = _NATIVE_OWNER.get(native[0], "SQLite" if dialect == "sqlite" else "PostgreSQL")
        raise StatementError(
            f"tx.execute takes {PORTABLE_STYLE}; {native!r} is a placeholder of {owner}'s own "
            "style, which does not run on the other backend; nothing was run"
        )
    return (text if values is not None else sql), values


@lru_cache(maxsize=1024)  # the caller's hot path: the same few statement texts, again and again
def _rendered(sql: str, postgres: bool) -> tuple[str, str | None]:
    """``sql`` for the driver (PostgreSQL: ``:name`` as ``%(name)s``, every ``%`` doubled), and
    the first placeholder of a driver's own style in it (:func:`lex`), or None."""
    out: list[str] = []
    copied = 0  # sql[copied:start] is copied as is (with its % doubled)
    for kind, start, end in lex(sql, postgres):
        if kind == NATIVE:
            return sql, sql[start:end]
        if kind == NAMED and postgres:
            out.append(sql[copied:start].replace("%", "%%"))
            out.append(f"%({sql[start + 1 : end]})s")
            copied = end
    if not postgres:
        return sql, None
    out.append(sql[copied:].replace("%", "%%"))
    return "".join(out), None
