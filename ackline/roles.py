"""The PostgreSQL roles of ``schemas/sql/0003_roles.sql``, and connecting as one of them.

Pure helpers (DSN user swap, the SCRAM-SHA-256 verifier) and the two statements the
``ackline roles`` command runs. Roles themselves are created and granted by the
migration, never here.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

if TYPE_CHECKING:  # only annotations: `ackline --help` must not import asyncpg
    import asyncpg

MIGRATOR: Final = "ackline_migrator"
INGEST: Final = "ackline_ingest"
READER: Final = "ackline_reader"
PROCESSOR: Final = "ackline_processor"  # `ackline process` (schemas/sql/0004_processors.sql)
ERASER: Final = "ackline_eraser"  # `ackline erase` (schemas/sql/0009_erasure.sql)
ROLES: Final = (MIGRATOR, INGEST, READER, PROCESSOR, ERASER)
LOGIN_ROLES: Final = (INGEST, READER, PROCESSOR, ERASER)
SCRAM_ITERATIONS: Final = 4096  # PostgreSQL's default scram_iterations


def dsn_user(dsn: str) -> str | None:
    """The user a ``postgresql://`` URL names (in the authority or as ``?user=``)."""
    parts = urlsplit(dsn)
    if parts.username:
        return unquote(parts.username)
    return dict(parse_qsl(parts.query)).get("user")


def dsn_password(dsn: str) -> str | None:
    """The password a ``postgresql://`` URL carries, if any."""
    parts = urlsplit(dsn)
    if parts.password is not None:
        return unquote(parts.password)
    return dict(parse_qsl(parts.query)).get("password")


def with_user(dsn: str, user: str) -> str:
    """``dsn`` connecting as ``user`` with no password (host, database, options kept)."""
    parts = urlsplit(dsn)
    hosts = parts.netloc.rpartition("@")[2]
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("user", "password")]
    return urlunsplit(
        parts._replace(netloc=f"{quote(user, safe='')}@{hosts}", query=urlencode(query))
    )


def scram_sha256_verifier(
    password: str, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS
) -> str:
    """The ``SCRAM-SHA-256$...`` verifier PostgreSQL stores for ``password`` (RFC 7677).

    Sent instead of the password, so the clear text never reaches the server or its
    statement log. ASCII only: PostgreSQL normalises passwords with SASLprep, which leaves
    printable ASCII unchanged and is not reimplemented here (ValueError otherwise).
    """
    if not (password.isascii() and password.isprintable()):
        raise ValueError("only printable ASCII passwords (else use ALTER ROLE ... PASSWORD)")
    salt = os.urandom(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode("ascii")

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


# format() quotes on the server: the role name with %I, the verifier with %L.
_ALTER_PASSWORD = "SELECT format('ALTER ROLE %I WITH LOGIN PASSWORD %L', $1::text, $2::text)"


async def set_password(conn: asyncpg.Connection, role: str, password: str) -> None:
    """Give ``role`` (one of :data:`LOGIN_ROLES`) a SCRAM password, and LOGIN.

    One autocommitted ALTER ROLE; nothing else changes. Needs a superuser or CREATEROLE.
    """
    if role not in LOGIN_ROLES:
        raise ValueError(f"{role} is not one of {', '.join(LOGIN_ROLES)}")
    statement = await conn.fetchval(_ALTER_PASSWORD, role, scram_sha256_verifier(password))
    await conn.execute(str(statement))


@dataclass(frozen=True, slots=True)
class RoleState:
    name: str
    exists: bool
    login: bool
    members: tuple[str, ...]


_ROLE_STATE = """
SELECT u.name, r.rolname IS NOT NULL AS exists, coalesce(r.rolcanlogin, false) AS login,
       coalesce(array(SELECT m.rolname FROM pg_auth_members AS a
                      JOIN pg_roles AS m ON m.oid = a.member
                      WHERE a.roleid = r.oid ORDER BY m.rolname), '{}') AS members
FROM unnest($1::text[]) WITH ORDINALITY AS u(name, n)
LEFT JOIN pg_roles AS r ON r.rolname = u.name
ORDER BY u.n
"""


async def role_states(conn: asyncpg.Connection) -> list[RoleState]:
    """Whether each ackline role exists, may log in, and who is a member. Read-only."""
    rows = await conn.fetch(_ROLE_STATE, list(ROLES))
    return [
        RoleState(str(r["name"]), bool(r["exists"]), bool(r["login"]), tuple(r["members"]))
        for r in rows
    ]
