"""Apply the versioned SQL files under ``schemas/sql`` exactly once each.

Files are named ``NNNN_name.sql`` and applied in order. Each runs in its own
transaction together with its row in ``schema_migrations`` (version, name, sha256),
under a transaction-level advisory lock so two migrators never interleave. A file
whose checksum changed after it was applied is an error, never silently re-run.

Ownership: ``0003_roles.sql`` creates the role ``ackline_migrator`` and gives it what
came before, ``schema_migrations`` included. From then on (in that database: the role is
cluster-wide, ownership is not) every migration runs under ``SET LOCAL ROLE
ackline_migrator`` when the connecting user may (a superuser, or a member), so the
objects it creates are owned by that role whoever runs ``ackline migrate``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import asyncpg

from ackline.sinks.errors import MigrationError

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_LOCK_KEY = 0x41434B4C  # "ACKL"

MIGRATOR_ROLE = "ackline_migrator"

_MAY_BE_MIGRATOR = """
SELECT coalesce(
    (SELECT pg_has_role(current_user, r.oid, 'MEMBER')
     FROM pg_class AS c JOIN pg_roles AS r ON r.oid = c.relowner
     WHERE c.oid = 'schema_migrations'::regclass AND r.rolname = $1),
    false)
"""
_SET_MIGRATOR = "SET LOCAL ROLE ackline_migrator"

_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    sha256     text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations() -> list[Migration]:
    """Read the migration files shipped in the ``schemas`` package, in order."""
    found: list[Migration] = []
    for entry in resources.files("ackline.schemas").joinpath("sql").iterdir():
        match = _NAME.match(entry.name)
        if match is None:
            continue
        found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a version: {versions}")
    return found


async def applied_versions(conn: asyncpg.Connection) -> dict[int, str]:
    await conn.execute(_BOOKKEEPING)
    rows = await conn.fetch("SELECT version, sha256 FROM schema_migrations")
    return {int(r["version"]): str(r["sha256"]) for r in rows}


async def migrate(
    conn: asyncpg.Connection, migrations: Sequence[Migration] | None = None
) -> list[int]:
    """Apply every pending migration; return the versions applied now.

    Order of effects per file: BEGIN; take the advisory lock; re-read the applied set;
    SET LOCAL ROLE ackline_migrator when it owns schema_migrations and the user may; run
    the file; insert its schema_migrations row; COMMIT (which ends the SET LOCAL ROLE). A crash
    before COMMIT leaves nothing of that file applied (PostgreSQL DDL is transactional),
    so re-running is safe. ``migrations`` defaults to :func:`load_migrations` (tests pass
    the shipped files plus one of their own).
    """
    done: list[int] = []
    for migration in load_migrations() if migrations is None else migrations:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            applied = await applied_versions(conn)
            if migration.version in applied:
                if applied[migration.version] != migration.sha256:
                    raise MigrationError(
                        f"migration {migration.version}_{migration.name}.sql changed after "
                        "it was applied; write a new migration instead"
                    )
                continue
            if await conn.fetchval(_MAY_BE_MIGRATOR, MIGRATOR_ROLE):
                await conn.execute(_SET_MIGRATOR)
            try:
                await conn.execute(migration.sql)
            except asyncpg.PostgresError as exc:
                raise MigrationError(
                    f"migration {migration.version}_{migration.name}.sql failed: {exc}"
                ) from exc
            await conn.execute(
                "INSERT INTO schema_migrations (version, name, sha256) VALUES ($1, $2, $3)",
                migration.version,
                migration.name,
                migration.sha256,
            )
            done.append(migration.version)
    return done
