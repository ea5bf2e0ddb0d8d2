"""What an operator sees when a command fails for an expected reason: one line, a fix.

:func:`explain` maps the exception classes an operator meets (PostgreSQL unreachable,
a database never migrated (:func:`never_migrated`, the one place that tells it, and
:func:`migrate_hint`, naming the setting the connection came from), a missing role or
grant, a path that cannot be written,
an unreadable manifest) to one line naming the problem and what to do; ``ackline.cli``
prints it and exits non-zero. :func:`connect` is how the operator commands open a
PostgreSQL connection: a failure to connect names the address (never the password).
:class:`Outage` bounds how long a command keeps retrying a database that is down, and
:func:`guarded_connect` applies both to the commands that read the feed.
"""

from __future__ import annotations

import errno
import gzip
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ackline.core.errors import AcklineError
from ackline.settings import Settings, dsn_address, dsn_hint

if TYPE_CHECKING:
    import asyncpg

DSN_HINT = dsn_hint()
T = TypeVar("T")


class DatabaseUnavailableError(AcklineError):
    """PostgreSQL cannot be reached at the address of the DSN."""

    def __init__(
        self,
        dsn: str,
        cause: BaseException,
        waited: float | None = None,
        setting: str = "ACKLINE_DATABASE_URL",
    ) -> None:
        how = f" for {waited:.0f} s" if waited else ""
        super().__init__(
            f"cannot connect to PostgreSQL at {dsn_address(dsn)}{how} ({reason(cause)}): "
            f"{dsn_hint(setting)}"
        )


def reason(exc: BaseException) -> str:
    """A short cause: the errno's text for socket errors, else the exception's text."""
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, OSError) and exc.errno and exc.errno > 0 and type(exc).__module__ != "ssl":
        return os.strerror(exc.errno).lower()  # a name lookup's or TLS's own text says more
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


async def connect(dsn: str, *, timeout: float, **kwargs: Any) -> asyncpg.Connection:
    """``asyncpg.connect`` for the operator commands, bounded by ``timeout``
    (ACKLINE_DB_CONNECT_TIMEOUT_S); DatabaseUnavailableError when the server cannot be
    reached (authentication and missing databases propagate: they have their own
    explanations)."""
    import asyncpg

    try:
        return await asyncpg.connect(dsn, timeout=timeout, **kwargs)
    except Exception as exc:
        if _unreached(exc):
            raise DatabaseUnavailableError(dsn, exc) from exc
        raise


async def on_database(
    settings: Settings, action: Callable[[asyncpg.Connection], Awaitable[T]]
) -> T:
    """``action`` on a connection as the operator (ACKLINE_DATABASE_URL, else the local
    stack's), connected within ACKLINE_DB_CONNECT_TIMEOUT_S (:func:`connect`), closed
    after it whatever happens."""
    from ackline.endpoints import database

    conn = await connect(database(settings), timeout=settings.db_connect_timeout_s)
    try:
        return await action(conn)
    finally:
        await conn.close()


# Static: the names are a parameter. to_regclass needs no privilege on the table.
_MISSING_TABLES = "SELECT t FROM unnest($1::text[]) AS t WHERE to_regclass(t) IS NULL ORDER BY t"
FEED_TABLES = ("feed_cursors", "processors")
"""What a processor (and `ackline dispatch`) reads and writes from its first step."""


async def require_tables(
    conn: asyncpg.Connection, tables: Sequence[str], setting: str = "ACKLINE_DATABASE_URL"
) -> None:
    """AcklineError (one line: run `ackline migrate`, naming ``setting``, the one
    ``conn``'s URL came from) when a table of ``tables`` is missing. For the commands
    whose loop would otherwise take the missing table for its own failure: `dispatch
    --once` logged "UndefinedTableError", then "could not record the failure", and
    exited 1 with no fix. Read-only: nothing to undo."""
    missing = [str(r["t"]) for r in await conn.fetch(_MISSING_TABLES, list(tables))]
    if missing:
        raise AcklineError(
            f"the database has no ackline schema (no table {', '.join(missing)}): "
            f"{migrate_hint(setting)}"
        )


# --- a database never migrated: the one place that tells it, and says the fix -------------


def migrate_hint(setting: str = "ACKLINE_DATABASE_URL") -> str:
    """The fix for a database never migrated, whose connection's URL came from
    ``setting``. `ackline migrate` connects with ACKLINE_DATABASE_URL: a command that
    connected by another setting (the processor's, the worker's) names it, since the
    database to migrate is the one it points at. Pure."""
    if setting == "ACKLINE_DATABASE_URL":
        return "run `ackline migrate` (with ACKLINE_DATABASE_URL pointing at this database)"
    return (
        f"run `ackline migrate` (with ACKLINE_DATABASE_URL pointing at the database of {setting})"
    )


def _names_a_missing_ackline_role(text: str) -> bool:
    """PostgreSQL's 'role "X" does not exist' for an ackline role (which only `ackline
    migrate` creates). Pure."""
    from ackline.roles import ROLES

    return any(f'role "{role}" does not exist' in text for role in ROLES)


def never_migrated(exc: BaseException) -> bool:
    """Whether ``exc`` shows a database `ackline migrate` never ran on: a missing table,
    or an ackline role missing where a statement names it (`ackline erase`'s SET ROLE
    ackline_eraser on a fresh cluster; a login as one is :func:`missing_role`'s). Pure."""
    import asyncpg

    if isinstance(exc, asyncpg.UndefinedTableError):
        return True
    return isinstance(exc, asyncpg.UndefinedObjectError) and _names_a_missing_ackline_role(str(exc))


def with_migrate_fix(line: str, cause: BaseException | None, what: str = "") -> str:
    """``line``, and the fix (with ``what`` migrate would create) when ``cause`` shows a
    database never migrated: for a command whose own error already says what failed
    (`ackline erase`: "nothing was erased: ..."). Pure."""
    if cause is None or not never_migrated(cause):
        return line
    return f"{line}: {migrate_hint()}{f'; {what}' if what else ''}"


def _unreached(exc: BaseException) -> bool:
    """A connect that failed because the server was not reached (or would not take the
    session yet), not because it refused this login or database: those have their own
    explanations."""
    import asyncpg

    return isinstance(
        exc, (OSError, asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError)
    )


class Outage:
    """Bounds how long a client retries a database that is unreachable, for a command
    that retries.

    ``wrap(connect)`` returns a connect function that raises DatabaseUnavailableError
    (not transient: the retry loop gives up) once connects have failed for longer than
    ``limit_s`` — when ``give_up`` — or logs one ERROR at that point and keeps going.
    Each wrapped function keeps its own clock: wrap once per client that retries (each
    runner of `ackline process`). One clock shared by several runners let one runner's
    success reset another's outage, and a failure nobody followed with a success (a
    runner that gave up and ended) stay on the clock, so that another runner, working
    all along on its own connection, gave up at its first failed reconnect, minutes
    later. What is said is shared: one ERROR for an outage however many clients see it,
    and one line when it is over.
    """

    def __init__(
        self,
        dsn: str,
        limit_s: float,
        give_up: bool,
        log: Any,
        setting: str = "ACKLINE_DATABASE_URL",
    ) -> None:
        self._dsn = dsn
        self._setting = setting  # the one the DSN came from, named in the hint
        self._limit = limit_s
        self._give_up = give_up
        self._log = log
        self._said = False  # the ERROR of the outage under way was logged

    def wrap(
        self, connect: Callable[[], Awaitable[asyncpg.Connection]]
    ) -> Callable[[], Awaitable[asyncpg.Connection]]:
        since: float | None = None  # this client's first failed connect of the outage
        escalated = False

        async def guarded() -> asyncpg.Connection:
            nonlocal since, escalated
            try:
                conn = await connect()
            except Exception as exc:
                now = time.monotonic()
                since = now if since is None else since
                escalated = self._failed(exc, now - since, escalated)
                raise
            if escalated and self._said:
                self._said = False
                self._log.info("PostgreSQL at %s answers again", dsn_address(self._dsn))
            since, escalated = None, False
            return conn

        return guarded

    def _failed(self, exc: Exception, waited: float, escalated: bool) -> bool:
        """Give up or escalate once ``waited`` passes the limit; whether escalated now."""
        if waited < self._limit:
            return escalated
        if self._give_up:
            raise DatabaseUnavailableError(self._dsn, exc, waited, self._setting) from exc
        if not escalated and not self._said:
            self._said = True
            self._log.error(
                "PostgreSQL at %s unreachable for %.0f s (%s); still retrying: %s",
                dsn_address(self._dsn),
                waited,
                reason(exc),
                dsn_hint(self._setting),
            )
        return True


def explain(exc: BaseException) -> str | None:
    """One line for an expected failure that reached the top, or None (a bug: let the
    traceback show). Pure."""
    found = _explain_database(exc)
    if found is not None:
        return found
    if isinstance(exc, (gzip.BadGzipFile, EOFError, UnicodeDecodeError)):
        return f"cannot read the file: {reason(exc)} (truncated or not the expected format)"
    if isinstance(exc, OSError) and exc.filename is not None:
        return path_problem(exc)
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return f"a service did not answer ({reason(exc)}): {DSN_HINT}"
    return None


def path_problem(exc: OSError, what: str = "") -> str:
    """``exc`` (an OSError on a path) as one line: the path, the reason (the errno's
    text), then the fix, which must not say the reason again."""
    path = exc.filename
    subject = f"{what} {path}" if what else str(path)
    code = exc.errno
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "choose a writable place, or fix its permissions"
    elif code == errno.EISDIR:
        fix = "give a file path"
    elif code == errno.ENOTDIR:
        fix = "a part of the path is a file"
    elif code == errno.ENOSPC:
        fix = "free some space, or choose another place"
    else:
        fix = "check the path"
    return f"{subject}: {reason(exc)}: {fix}"


def missing_role(text: str, setting: str) -> str:
    """What to do about PostgreSQL's 'role "X" does not exist' (``text``). Pure. `ackline
    migrate` creates the ackline roles only: for any other name (a misspelled user in
    ``setting``, the URL it came from) the fix is the URL, and a misspelled
    "ackline_ingset" was sent to migrate, which would never create it."""
    from ackline.roles import ROLES

    if _names_a_missing_ackline_role(text):
        return f"{text}: {migrate_hint(setting)} (it creates the ackline roles)"
    return (
        f"{text}: check the user in {setting} (`ackline migrate` creates only {', '.join(ROLES)})"
    )


_DATABASE_SETTINGS = (
    "ACKLINE_DATABASE_URL (or the one the command connects with when set: the worker's "
    "ACKLINE_DATABASE_INGEST_URL, the processors' ACKLINE_DATABASE_PROCESSOR_URL)"
)
"""Where a login or database refused at connect may come from: the explanation cannot
tell which URL the failed connection used."""


def _explain_database(exc: BaseException) -> str | None:
    import asyncpg

    if never_migrated(exc):
        return f"the database has no ackline schema ({exc}): {migrate_hint()}"
    if isinstance(exc, asyncpg.InvalidPasswordError):
        return (
            f"PostgreSQL refused the password ({exc}): check the password in {_DATABASE_SETTINGS}"
        )
    if isinstance(exc, asyncpg.InvalidAuthorizationSpecificationError):
        text = str(exc)
        if "does not exist" in text:
            return missing_role(text, _DATABASE_SETTINGS)
        return f"PostgreSQL refused the login ({text}): check the user in ACKLINE_DATABASE_URL"
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return f"{exc}: create it, or fix the database name in {_DATABASE_SETTINGS}"
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        return (
            f"PostgreSQL: {exc}: connect as a role that holds the grant (`ackline roles show`; "
            "docs/roles.md)"
        )
    if isinstance(exc, (asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError)):
        return f"lost PostgreSQL ({reason(exc)}): {DSN_HINT}"
    if isinstance(exc, asyncpg.UndefinedObjectError) and "configuration parameter" in str(exc):
        return (
            f"PostgreSQL: {exc}: the driver sends a query parameter of {_DATABASE_SETTINGS} "
            "that it does not read itself to PostgreSQL as a setting: remove it"
        )
    if isinstance(exc, asyncpg.InvalidParameterValueError):
        return (
            f"PostgreSQL refused a value ({exc}): where it came with the connection, check "
            f"the query parameters (options, settings) of {_DATABASE_SETTINGS}"
        )
    if isinstance(exc, asyncpg.ClientConfigurationError):
        return f"{exc}: fix {_DATABASE_SETTINGS}"
    if isinstance(exc, asyncpg.TooManyConnectionsError):
        return (
            f"PostgreSQL refused the connection ({exc}): end idle sessions, or raise "
            "max_connections (or the role's connection limit)"
        )
    return None


def guarded_connect(
    dsn: str,
    connect: Callable[[], Awaitable[asyncpg.Connection]],
    limit_s: float,
    give_up: bool,
    log: Any,
) -> Callable[[], Awaitable[asyncpg.Connection]]:
    """``connect`` for a command that reads the feed: PostgreSQL unreachable at the first
    connect is :class:`DatabaseUnavailableError` at once (one line, a fix); lost later,
    :class:`Outage` bounds the retries at ``limit_s`` (ACKLINE_RETRY_MAX_SECONDS) when
    ``give_up``, else logs one ERROR then and goes on."""
    later = Outage(dsn, limit_s, give_up, log).wrap(connect)
    first = True

    async def guarded() -> asyncpg.Connection:
        nonlocal first
        if not first:
            return await later()
        try:
            conn = await connect()
        except Exception as exc:
            if _unreached(exc):
                raise DatabaseUnavailableError(dsn, exc) from exc
            log.debug("first connect failed: %s", reason(exc))
            raise
        first = False
        return conn

    return guarded
