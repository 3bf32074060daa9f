"""Where an ingestion job reads its rows: a SQL table, or any callable.

A source describes itself (the plan's fingerprint hashes the description),
finds its key range, and yields the rows of a key range in ascending key
order, a bounded page at a time (memory stays flat in the table's size).
Keys are integers, unique, and never read with OFFSET.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from tenure._core.exceptions import (
    ArgumentError,
    MissingDependencyError,
    SourceRowError,
    SourceUnavailableError,
)
from tenure._core.rows import REFUSED, Row

__all__ = [
    "MAX_KEY",
    "AsyncCallableSource",
    "AsyncRowSource",
    "CallableSource",
    "KeyOrder",
    "RowSource",
    "SqlSource",
    "declared_range",
]

F = TypeVar("F", bound=Callable[..., Any])


class RowSource(Protocol):
    """What an :class:`~tenure.IngestJob` reads: implement it for a source of your own.

    Any object with these three methods will do (a file, an HTTP API, another
    store); :class:`SqlSource` and :class:`CallableSource` are two. Keys are
    integers within +-(2**53 - 1), each row a dict that JSON can encode.
    """

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description that names this source (no secrets)."""
        ...

    def key_range(self) -> tuple[int, int]:
        """The smallest and largest key; :class:`ArgumentError` if there are none."""
        ...

    def rows(self, first: int, last: int) -> Iterator[Row]:
        """``(key, row)`` for every key in ``first..last`` (both included), ascending."""
        ...


MAX_KEY = 2**53 - 1
"""The largest key magnitude: the server's scripts count keys as doubles, exact up to it."""


class SqlSource:
    """A table read through SQLAlchemy Core, by ranges of an integer primary key.

    ``url`` is a SQLAlchemy URL (``sqlite:///path.db``,
    ``postgresql+psycopg://...``, ``mysql+pymysql://...``) or an ``Engine``.
    ``page`` rows are read per query: ``WHERE key > last_seen AND key <=
    chunk_end ORDER BY key LIMIT page``. The database out of reach, or lost
    at any later point, raises :class:`~tenure.SourceUnavailableError`
    naming its kind, host and port and why; a cell the driver (or
    SQLAlchemy) cannot convert raises :class:`~tenure.SourceRowError`
    naming the row's key and the column.
    """

    def __init__(self, url: Any, table: str, key: str, *, page: int = 1000) -> None:
        try:
            import sqlalchemy  # optional dependency: pip install "tenure[sql]"
        except ImportError:
            raise MissingDependencyError(
                'SqlSource needs SQLAlchemy: pip install "tenure[sql]"'
            ) from None
        self._sa = sqlalchemy
        if not isinstance(page, int) or page < 1:
            raise ArgumentError("page", f"must be a positive int, got {page!r}")
        self.page = page
        self.engine = _engine(sqlalchemy, url) if isinstance(url, str) else url
        try:
            with self.engine.connect():
                pass
        except sqlalchemy.exc.DBAPIError as exc:
            raise _unavailable(self.engine.url, exc) from exc
        try:
            with self._connected(f"reading the columns of {table!r}") as conn:
                self.table = sqlalchemy.Table(table, sqlalchemy.MetaData(), autoload_with=conn)
        except sqlalchemy.exc.NoSuchTableError:
            raise ArgumentError("table", f"no table {table!r} in {self._where()}") from None
        for column in self.table.columns:  # MySQL's DOUBLE and FLOAT reflect as decimals
            if isinstance(column.type, sqlalchemy.Float) and column.type.asdecimal:
                column.type.asdecimal = False
        if key not in self.table.c:
            columns = ", ".join(self.table.c.keys())
            raise ArgumentError("key", f"table {table!r} has no column {key!r} ({columns})")
        self.key = self.table.c[key]

    def _where(self) -> str:
        return str(self.engine.url.render_as_string(hide_password=True))

    @contextlib.contextmanager
    def _connected(self, doing: str) -> Iterator[Any]:
        """A connection; the database failing meanwhile raises :class:`SourceUnavailableError`.

        Lost, refused, reset, shut down or restarting (the driver's
        ``OperationalError``, ``InterfaceError``, or a connection SQLAlchemy
        found invalid), named with its kind, host and port, and ``doing``.
        Other errors (a driver's conversion failure) go on as they are.
        """
        sa = self._sa
        try:
            with self.engine.connect() as conn:
                yield conn
        except sa.exc.DBAPIError as exc:
            if not (
                isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError))
                or exc.connection_invalidated
                or _NOT_A_DATABASE in str(exc).lower()  # (SQLite's DatabaseError)
            ):
                raise
            raise _unavailable(self.engine.url, exc, doing) from exc

    def describe(self) -> dict[str, Any]:
        """Kind, database (password hidden), table and key column."""
        return {
            "kind": "sql",
            "database": self._where(),
            "table": self.table.name,
            "key": self.key.name,
        }

    def key_range(self) -> tuple[int, int]:
        """MIN and MAX of the key, after checking it is an integer and unique."""
        sa = self._sa
        query = sa.select(
            sa.func.min(self.key),
            sa.func.max(self.key),
            sa.func.count(),
            sa.func.count(sa.distinct(self.key)),
        ).select_from(self.table)
        with self._connected(f"reading the key range of {self.table.name!r}") as conn:
            low, high, rows, distinct = conn.execute(query).one()
            stray = self._first_non_integer(conn)  # checked first: MIN may be an integer
        name = f"{self.table.name}.{self.key.name}"
        if rows == 0:
            raise ArgumentError("table", f"{self.table.name!r} is empty: nothing to ingest")
        for value in (low, high) if stray is None else (stray,):
            if type(value) is not int:
                raise ArgumentError(
                    "key",
                    f"{name} must be an integer column ({self.key.type}); it holds "
                    f"{value!r}: nothing was read",
                )
            if not -MAX_KEY <= value <= MAX_KEY:
                raise ArgumentError(
                    "key",
                    f"{name} holds {value}, outside +-{MAX_KEY:,} (2**53 - 1): the range "
                    "the server's scripts count exactly",
                )
        if distinct != rows:
            raise ArgumentError(
                "key", f"{name} is not unique ({rows - distinct} duplicate or NULL keys)"
            )
        return int(low), int(high)

    def _first_non_integer(self, conn: Any) -> Any:
        """A key value that is not an integer, if one is found (else None).

        SQLite stores what it is given whatever the column's type (2.5, or
        'x', in an INTEGER column); other databases enforce an integer
        column's type, and a column of another type is refused by its
        MIN/MAX (or here, for a numeric one: 2.5 in a NUMERIC column).
        """
        sa = self._sa
        if self.engine.dialect.name == "sqlite":
            stray = sa.func.typeof(self.key) != "integer"
        elif isinstance(self.key.type, sa.Integer):
            return None
        elif isinstance(self.key.type, sa.Numeric):
            stray = self.key != sa.func.floor(self.key)
        else:
            return None  # text and the like: MIN/MAX are not integers
        query = sa.select(self.key).where(self.key.is_not(None), stray).limit(1)
        found = conn.execute(query).first()
        return None if found is None else found[0]

    def rows(self, first: int, last: int) -> Iterator[Row]:
        """The rows of ``first..last``, a page per query.

        The database failing mid-read raises :class:`SourceUnavailableError`;
        a cell the driver cannot convert, :class:`SourceRowError` naming its
        key and column.
        """
        after = first - 1
        while True:
            page = self._page(after, last)
            for row in page:
                key = row[self.key.name]
                if type(key) is not int:  # written since key_range() checked
                    raise ArgumentError(
                        "key", f"{self.table.name}.{self.key.name} holds {key!r}: not an integer"
                    )
                yield key, row
            after = int(page[-1][self.key.name]) if page else last
            if len(page) < self.page or after >= last:  # no query for an empty range
                return

    def _page(self, after: int, last: int) -> list[dict[str, Any]]:
        """The rows of keys ``after`` (excluded) to ``last``, at most a page, in key order."""
        sa = self._sa
        query = (
            sa.select(self.table)
            .where(self.key > after, self.key <= last)
            .order_by(self.key)
            .limit(self.page)
        )
        with self._connected(f"reading {self.table.name!r} keys {after + 1}..{last}") as conn:
            try:
                result = conn.execute(query)
                columns = tuple(result.keys())  # a row is a tuple: zipped, not ._mapping
                return [dict(zip(columns, row, strict=True)) for row in result]
            except (*_UNCONVERTED, sa.exc.DataError) as exc:
                failed = exc
        raise self._unconvertible(after, last, failed) from failed

    def _unconvertible(self, after: int, last: int, exc: BaseException) -> SourceRowError:
        """The error for a page whose reading raised ``exc``: its key and column found.

        A conversion fails in the driver or in SQLAlchemy's result processing,
        which name neither; the column is found by reading each one alone, and
        the key by halving the page's keys (a few queries, on this error path
        only).
        """
        sa = self._sa
        doing = f"looking for the cell of {self.table.name!r} that failed"
        query = (
            sa.select(self.key)
            .where(self.key > after, self.key <= last)
            .order_by(self.key)
            .limit(self.page)
        )
        with self._connected(doing) as conn:
            keys = [int(key) for (key,) in conn.execute(query)]
        for column in self.table.columns:
            if column.name == self.key.name or not keys:
                continue
            found = self._conversion_failure(column, keys[0], keys[-1], doing)
            if found is None:
                continue
            low, high = 0, len(keys) - 1  # the failing key is among keys[low..high]
            while low < high:
                middle = (low + high) // 2
                failure = self._conversion_failure(column, keys[low], keys[middle], doing)
                if failure is None:
                    low = middle + 1
                else:
                    high, found = middle, failure
            key = keys[low]
            held = self._as_text(column, key)
            return SourceRowError(
                f"{self.table.name!r} row {key}, column {column.name!r} ({column.type}){held}, "
                f"which cannot be converted: {_said(found)} ({REFUSED})",
                key=key,
                column=column.name,
            )
        return SourceRowError(
            f"{self.table.name!r} keys {after + 1}..{last}: a row cannot be converted: "
            f"{_said(exc)} ({REFUSED})",
            key=None,
            column=None,
        )

    def _conversion_failure(
        self, column: Any, low: int, high: int, doing: str
    ) -> BaseException | None:
        """What reading ``column`` for keys ``low..high`` raised in a conversion, or None."""
        sa = self._sa
        query = sa.select(self.key, column).where(self.key >= low, self.key <= high)
        with self._connected(doing) as conn:
            try:
                for _ in conn.execute(query):
                    pass
            except (*_UNCONVERTED, sa.exc.DataError) as exc:
                return exc
        return None

    def _as_text(self, column: Any, key: int) -> str:
        """`` holds 'abc'``: the cell as the database writes it as text, or "" if it cannot."""
        sa = self._sa
        query = sa.select(sa.cast(column, sa.Text)).where(self.key == key)
        try:
            with self.engine.connect() as conn:
                text = conn.execute(query).scalar()
        except Exception:  # only a detail of the message
            return ""
        if not isinstance(text, str):
            return ""
        return f" holds {text if len(text) <= 40 else text[:37] + '...'!r}"


# What a driver or SQLAlchemy raises converting a cell (a ValueError from a date's
# parser, a TypeError or decimal.InvalidOperation from a decimal's, a LookupError
# from an enum's); the driver's own conversion errors are SQLAlchemy DataErrors.
_UNCONVERTED = (ValueError, TypeError, ArithmeticError, LookupError)


def _said(exc: BaseException) -> str:
    """The first line of what the driver (or SQLAlchemy) said, without SQLAlchemy's wrapping."""
    said = str(getattr(exc, "orig", None) or exc).strip()
    return said.splitlines()[0] if said else type(exc).__name__


_KINDS = {"postgresql": "PostgreSQL", "mysql": "MySQL", "mariadb": "MariaDB", "sqlite": "SQLite",
          "mssql": "SQL Server", "oracle": "Oracle"}  # fmt: skip
_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306, "mssql": 1433, "oracle": 1521}
_NOT_A_DATABASE = "file is not a database"
_REASONS = (  # what a driver's message says -> what we say
    (_NOT_A_DATABASE, "the file is not an SQLite database"),
    ("connection refused", "connection refused"),
    ("server closed the connection", "the server closed the connection"),
    ("unexpected postmaster exit", "the server stopped"),
    ("terminating connection due to administrator command", "the server is shutting down"),
    ("the database system is shutting down", "the server is shutting down"),
    ("the database system is starting up", "the server is starting up"),
    ("the database system is in recovery mode", "the server is recovering"),
    ("consuming input failed", "the connection was lost"),
    ("lost connection", "the connection was lost"),
    ("server has gone away", "the server has gone away"),
    ("connection reset", "the connection was reset"),
    ("broken pipe", "the connection was lost"),
    ("the connection is closed", "the connection was closed"),
    ("connection is lost", "the connection was lost"),
    ("database is locked", "the database is locked"),
    ("disk i/o error", "disk I/O error"),
    ("timed out", "timed out"),
    ("timeout expired", "timed out"),
    ("could not translate host name", "unknown host"),
    ("name or service not known", "unknown host"),
    ("unknown mysql server host", "unknown host"),
    ("password authentication failed", "authentication failed"),
    ("access denied", "access denied"),
    ("does not exist", "the database does not exist"),
    ("unknown database", "the database does not exist"),
    ("no route to host", "no route to host"),
    ("unable to open database file", "unable to open the database file"),
)


def _engine(sa: Any, url: str) -> Any:
    """An engine for ``url``, checked before any connection: a URL, a known kind, a file."""
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        if url and "://" not in url:  # a plain path
            hint = f"did you mean sqlite:///{url}?"
            raise ArgumentError("url", f"not a database URL: {hint}") from None
        raise ArgumentError(
            "url",
            f"not a database URL: {url!r} (e.g. sqlite:///data.db, "
            "postgresql+psycopg://user@host/db)",
        ) from None
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        uri = database.startswith("file:") or parsed.query.get("uri") == "true"
        if database not in ("", ":memory:") and not uri and not Path(database).is_file():
            why = "the file does not exist"
            if Path(database).is_dir():
                why += " (it is a folder)"
            raise SourceUnavailableError(
                f"no SQLite database at {database}: {why}", kind="SQLite", why=why
            )
    try:
        return sa.create_engine(parsed)
    except sa.exc.NoSuchModuleError:
        raise ArgumentError(
            "url", f"unknown database kind {parsed.drivername!r} (got {url!r})"
        ) from None
    except ImportError as exc:
        driver = exc.name or str(exc)
        package = _DRIVER_PACKAGES.get(driver, driver)
        raise MissingDependencyError(
            f"{parsed.drivername} URLs need the {driver} driver: pip install {package}"
            + (
                " (or write mysql+pymysql://, pure Python: pip install pymysql)"
                if driver == "MySQLdb"
                else ""
            )
        ) from None


# Drivers whose import name is not their package's name on PyPI.
_DRIVER_PACKAGES = {
    "MySQLdb": "mysqlclient",
    "psycopg2": "psycopg2-binary",
    "psycopg": "'psycopg[binary]'",
}


def _unavailable(url: Any, exc: BaseException, doing: str | None = None) -> SourceUnavailableError:
    """The database of ``url`` could not be reached (or failed while ``doing``), and why.

    One line naming the kind, host and port (a SQLite file's path) and the
    reason, read from the driver's message.
    """
    backend = url.get_backend_name()
    kind = _KINDS.get(backend, backend)
    host: str | None = None
    port: int | None = None
    if backend == "sqlite":
        where = url.database or ":memory:"
    else:
        host, port = url.host or "localhost", url.port or _PORTS.get(backend)
        where = f"{host}:{port or '?'}"
    lowered = str(getattr(exc, "orig", None) or exc).lower()
    reason = next((ours for theirs, ours in _REASONS if theirs in lowered), None) or _said(exc)
    if doing is None:
        message = f"cannot connect to {kind} at {where}: {reason}"
    else:
        message = f"{kind} at {where} failed while {doing}: {reason}"
    return SourceUnavailableError(message, kind=kind, host=host, port=port, why=reason)


class _FetchSource(Generic[F]):
    """What the callable sources share: the callable, the key range and the name."""

    def __init__(self, fetch: F, *, low: int, high: int, name: str) -> None:
        if not callable(fetch):
            raise ArgumentError("fetch", "must be callable")
        for argument, key in (("low", low), ("high", high)):
            if isinstance(key, bool) or not isinstance(key, int):
                raise ArgumentError(argument, f"must be an int key, got {key!r}")
            if not -MAX_KEY <= key <= MAX_KEY:
                raise ArgumentError(
                    argument,
                    f"{key} is outside +-{MAX_KEY:,} (2**53 - 1): the range the server's "
                    "scripts count exactly",
                )
        if high < low:
            raise ArgumentError("high", f"the key range is empty ({low}..{high})")
        if not isinstance(name, str) or not name:
            raise ArgumentError("name", f"must be a non-empty str, got {name!r}")
        self._fetch = fetch
        self.low, self.high, self.name = low, high, name

    def describe(self) -> dict[str, Any]:
        """Kind and name (a callable and an async callable of one name are one source)."""
        return {"kind": "callable", "name": self.name}


def declared_range(source: object) -> tuple[int, int] | None:
    """The key range a source was given (a callable source's), or None (read from data)."""
    if isinstance(source, _FetchSource):
        return source.low, source.high
    return None


class CallableSource(_FetchSource[Callable[[int, int], Iterable[Row]]]):
    """Any callable that yields ``(key, row)`` for a key range, in ascending key order.

    ``fetch(first, last)`` is called with a chunk's remaining range;
    ``low``/``high`` are the keys the job covers and ``name`` names the
    source in the plan (a different name is a different plan).
    """

    def key_range(self) -> tuple[int, int]:
        """The range given."""
        return self.low, self.high

    def rows(self, first: int, last: int) -> Iterator[Row]:
        """What ``fetch`` yields, checked to ascend within the range."""
        order = KeyOrder(first, last)
        for item in self._fetch(first, last):
            yield order.pair(item)


class KeyOrder:
    """Checks that a source's keys are integers ascending within ``first..last``."""

    def __init__(self, first: int, last: int, *, argument: str = "fetch") -> None:
        self.previous, self.last = first - 1, last
        self.argument = argument  # what the error names

    def pair(self, item: Any) -> Row:
        """Accept a yielded ``(key, row)`` or raise :class:`ArgumentError` saying why."""
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ArgumentError(
                self.argument,
                f"yielded {_shown(item)}, not a (key, row) pair (refused before it was written)",
            )
        key, row = item
        self.check(key)
        return key, row

    def check(self, key: int) -> None:
        """Accept ``key`` or raise :class:`ArgumentError` naming it and the range."""
        if type(key) is not int:
            raise ArgumentError(
                self.argument, f"yielded key {key!r}, not an int (refused before it was written)"
            )
        if not self.previous < key <= self.last:
            raise ArgumentError(
                self.argument,
                f"yielded key {key} outside {self.previous + 1}..{self.last} or out of "
                "order (keys must be unique and ascending; refused before it was written)",
            )
        self.previous = key


class AsyncRowSource(Protocol):
    """What an :class:`~tenure.AsyncIngestJob` reads without a thread: async key range and rows.

    :class:`RowSource` for asyncio: ``key_range`` is a coroutine and ``rows``
    an async iterator (:class:`AsyncCallableSource` is one).
    """

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description that names this source (no secrets)."""
        ...

    async def key_range(self) -> tuple[int, int]:
        """The smallest and largest key."""
        ...

    def rows(self, first: int, last: int) -> AsyncIterator[Row]:
        """``(key, row)`` for every key in ``first..last`` (both included), ascending."""
        ...


class AsyncCallableSource(_FetchSource[Callable[[int, int], AsyncIterable[Row]]]):
    """An async generator function that yields ``(key, row)`` for a key range, ascending.

    :class:`CallableSource` for :class:`~tenure.AsyncIngestJob`, when the rows
    come from an asyncio driver (asyncpg, aiomysql, an HTTP API):
    ``fetch(first, last)`` is called with a chunk's remaining range.
    """

    async def key_range(self) -> tuple[int, int]:
        """The range given."""
        return self.low, self.high

    async def rows(self, first: int, last: int) -> AsyncIterator[Row]:
        """What ``fetch`` yields, checked to ascend within the range."""
        order = KeyOrder(first, last)
        async for item in self._fetch(first, last):
            yield order.pair(item)


def _shown(value: Any) -> str:
    """``value``'s repr, cut to 60 characters for a message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
