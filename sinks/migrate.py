"""Apply the versioned SQL files under ``schemas/sql`` exactly once each.

Files are named ``NNNN_name.sql`` and applied in order. Each runs in its own
transaction together with its row in ``schema_migrations`` (version, name, sha256),
under a transaction-level advisory lock so two migrators never interleave. A file
whose checksum changed after it was applied is an error, never silently re-run.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

from sinks.errors import MigrationError

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_LOCK_KEY = 0x41434B4C  # "ACKL"

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
    for entry in resources.files("schemas").joinpath("sql").iterdir():
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


async def migrate(conn: asyncpg.Connection) -> list[int]:
    """Apply every pending migration; return the versions applied now.

    Order of effects per file: BEGIN; take the advisory lock; re-read the applied set;
    run the file; insert its schema_migrations row; COMMIT. A crash before COMMIT leaves
    nothing of that file applied (PostgreSQL DDL is transactional), so re-running is safe.
    """
    done: list[int] = []
    for migration in load_migrations():
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
