"""Roles and grants: what the roles migration says, and whether the database agrees.

Data-driven: the expected privileges are read from the roles migration itself (the
``schemas/sql/NNNN_*role*.sql`` file), so the check follows the file instead of a
second copy of it. :func:`expected` understands the plain statement forms —
``CREATE ROLE name``, ``GRANT privs ON [TABLE|SEQUENCE|SCHEMA] a, b TO r1, r2``,
``GRANT privs ON ALL TABLES|SEQUENCES IN SCHEMA s TO r``, column privileges
(``GRANT SELECT (a, b), UPDATE (c) ON t TO r``), ``GRANT EXECUTE ON FUNCTION
f(argtypes) TO r`` and the matching ``REVOKE`` — applied in file order; anything else
(role membership, default privileges, dynamic SQL) is left out and counted in
``skipped``. A worker needs its column and function grants as much as its table grants
(0016's SELECT of ``src_topic_id``, 0015's EXECUTE of ``ackline_record_topic_id``), so
doctor checks them too.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import asyncpg

from ackline.sinks.admin.migrate import Migration

Kind = Literal["table", "sequence", "schema", "column", "columns", "function"]

_ALL_PRIVILEGES: dict[Kind, tuple[str, ...]] = {
    "table": ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"),
    "sequence": ("USAGE", "SELECT", "UPDATE"),
    "schema": ("USAGE", "CREATE"),
    "column": ("SELECT", "INSERT", "UPDATE", "REFERENCES"),
    "columns": ("SELECT", "INSERT", "UPDATE", "REFERENCES"),
    "function": ("EXECUTE",),
}
_PART = r'(?:[A-Za-z_][A-Za-z0-9_$]*|"[^"]+")'
_IDENT = re.compile(rf"^{_PART}(?:\.{_PART})?$")
_CREATE_ROLE = re.compile(r'\bCREATE\s+(?:ROLE|USER)\s+([A-Za-z_][\w$]*|"[^"]+")', re.I)
_GRANT = re.compile(
    r"\bGRANT\s+(?P<privs>.+?)\s+ON\s+(?P<target>.+?)\s+TO\s+(?P<roles>.+?)"
    r"(?:\s+WITH\s+GRANT\s+OPTION)?\s*$",
    re.I | re.S,
)
_REVOKE = re.compile(
    r"\bREVOKE\s+(?:GRANT\s+OPTION\s+FOR\s+)?(?P<privs>.+?)\s+ON\s+(?P<target>.+?)"
    r"\s+FROM\s+(?P<roles>.+?)(?:\s+(?:CASCADE|RESTRICT))?\s*$",
    re.I | re.S,
)
_ALL_IN_SCHEMA = re.compile(r"^ALL\s+(TABLES|SEQUENCES)\s+IN\s+SCHEMA\s+(.+)$", re.I | re.S)
_OUTSIDE_PARENS = re.compile(r",(?![^()]*\))")  # a comma not inside a (column or argument) list
_PRIVILEGE = re.compile(r"^(?P<word>[A-Za-z]+(?:\s+[A-Za-z]+)?)\s*(?:\((?P<columns>[^()]*)\))?$")
_FUNCTION = re.compile(rf"^(?P<name>{_PART}(?:\.{_PART})?)\s*\((?P<args>[^()]*)\)$")


@dataclass(frozen=True, slots=True)
class Privilege:
    """One privilege of one role. ``obj`` is the table, sequence, schema or function
    (``name(argtypes)``); a column privilege names its table in ``obj`` and its column in
    ``column``; ``columns``, the privilege on any column of the table (or the table
    itself: ``has_any_column_privilege``), is what a role the file grants no such
    privilege there must not hold. ``public`` is the PUBLIC pseudo-role."""

    role: str
    kind: Kind
    obj: str
    privilege: str
    column: str = ""

    @property
    def target(self) -> str:
        """What the privilege is on, as a report names it: ``rejects.src_topic_id``."""
        return f"{self.obj}.{self.column}" if self.column else self.obj

    @property
    def said(self) -> str:
        """The privilege as a report says it: ``SELECT on column rejects.src_topic_id``."""
        if self.kind == "columns":
            return f"{self.privilege} on a column of {self.obj}"
        return f"{self.privilege} on {self.kind} {self.target}"


@dataclass
class Expected:
    """Roles the file creates, and each privilege's final state (True: granted)."""

    roles: list[str] = field(default_factory=list)
    privileges: dict[Privilege, bool] = field(default_factory=dict)
    skipped: int = 0


@dataclass(frozen=True, slots=True)
class RolesReport:
    migration: str
    applied: bool
    expected: Expected
    missing_roles: list[str]
    wrong: list[tuple[Privilege, bool]]  # (privilege, what the database holds)
    # functions whose signature PostgreSQL could not read (argument names or modes in
    # it): their privileges are not checked
    unchecked: list[str] = field(default_factory=list)
    # write privileges the grantees hold on tables no migration creates (a processor's
    # own tables, granted by its setup_sql as docs/processors.md says): information only
    outside: list[Privilege] = field(default_factory=list)


def roles_migration(migrations: Sequence[Migration]) -> Migration | None:
    """The newest migration whose name mentions roles, if any."""
    found = [m for m in migrations if "role" in m.name]
    return found[-1] if found else None


def grants_model(
    migrations: Sequence[Migration], applied: Collection[int] | None
) -> Migration | None:
    """What the database's privileges are compared with: the roles migration
    (:func:`roles_migration`), which restates the whole model, and the GRANTs and REVOKEs
    of every later migration that is applied (``applied``: versions; None, all), each
    of which adds to it (0015 and 0016: SELECT on ``topic_incarnations``, which a worker
    needs to write a reject or conflict). Only the roles file was read before, and a
    privilege a later migration granted could be missing while doctor said the grants
    matched. Pure."""
    roles = roles_migration(migrations)
    if roles is None:
        return None
    later = [
        m
        for m in migrations
        if m.version > roles.version and (applied is None or m.version in applied)
    ]
    if not later:
        return roles
    # named for the reports: "0010_roles.sql and the grants of 0011-0016.sql"
    name = f"{roles.name}.sql and the grants of {later[0].version:04d}-{later[-1].version:04d}"
    return replace(roles, name=name, sql="\n".join([roles.sql, *(m.sql for m in later)]))


_NAME = r'(?:[A-Za-z_][\w$]*|"[^"]+")(?:\.(?:[A-Za-z_][\w$]*|"[^"]+"))?'
_CREATES = re.compile(
    rf"\bCREATE\s+(?:UNLOGGED\s+)?(?:TABLE|(?:MATERIALIZED\s+)?VIEW)\s+"
    rf"(?:IF\s+NOT\s+EXISTS\s+)?({_NAME})\s*(?:\(|\bAS\b|\bPARTITION\b)",
    re.I,
)
_RENAMES = re.compile(
    rf"\bALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?{_NAME}\s+RENAME\s+TO\s+({_NAME})", re.I
)


def migration_tables(migrations: Sequence[Migration]) -> set[str]:
    """The tables and views the migrations create (or rename to), as
    :func:`with_no_extra_writes` names them (``public``'s unqualified). Pure.

    Their partitions are the database's to list; tables made elsewhere (a processor's
    ``setup_sql``) are not in it."""
    found = {"schema_migrations"}  # made by sinks.admin.migrate itself
    for m in migrations:
        text = re.sub(r"--[^\n]*", "", m.sql)
        for match in (*_CREATES.finditer(text), *_RENAMES.finditer(text)):
            name = _unquote(match[1])
            found.add(name.removeprefix("public."))
    return found


def _unquote(name: str) -> str:
    """An identifier as PostgreSQL stores it: quoted kept as is, unquoted folded to lower."""
    parts = re.findall(r'"[^"]+"|[^.]+', name.strip())
    return ".".join(p[1:-1] if p.startswith('"') else p.lower() for p in parts)


def _names(text: str) -> list[str] | None:
    parts = [p.strip() for p in _OUTSIDE_PARENS.split(text)]
    if not all(_IDENT.match(p) for p in parts):
        return None
    return [_unquote(p) for p in parts]


def _targets(
    target: str, schema_tables: dict[str, list[str]], schema_sequences: dict[str, list[str]]
) -> tuple[Kind, list[str]] | None:
    target = " ".join(target.split())
    match = _ALL_IN_SCHEMA.match(target)
    if match:
        schemas = _names(match[2])
        if schemas is None:
            return None
        source = schema_tables if match[1].upper() == "TABLES" else schema_sequences
        kind: Kind = "table" if match[1].upper() == "TABLES" else "sequence"
        return kind, [obj for s in schemas for obj in source.get(s, [])]
    head, _, rest = target.partition(" ")
    word = head.upper()
    if word in ("TABLE", "SEQUENCE", "SCHEMA"):
        names = _names(rest)
        kind = "table" if word == "TABLE" else "sequence" if word == "SEQUENCE" else "schema"
    elif word == "FUNCTION":
        functions = [_function(p) for p in _OUTSIDE_PARENS.split(rest)]
        if any(f is None for f in functions):
            return None
        return "function", [f for f in functions if f is not None]
    elif word in ("DATABASE", "PROCEDURE", "ROUTINE", "TYPE", "DOMAIN", "ALL"):
        return None
    else:
        names, kind = _names(target), "table"
    return None if names is None else (kind, names)


def _function(text: str) -> str | None:
    """``f(a, b)`` as ``to_regprocedure`` reads it: the name as stored, the argument types
    as written (types only: a signature naming its arguments is not understood)."""
    match = _FUNCTION.match(text.strip())
    if match is None:
        return None
    args = [" ".join(a.split()) for a in match["args"].split(",") if a.strip()]
    # quoted parts stay quoted: to_regprocedure folds an unquoted name to lower case
    parts = re.findall(r'"[^"]+"|[^.]+', match["name"])
    name = ".".join(p if p.startswith('"') else p.lower() for p in parts)
    return f"{name}({', '.join(args)})"


def _privileges(text: str, kind: Kind) -> list[tuple[str, list[str]]] | None:
    """Each privilege with its columns ([]: the whole object), or None where the list
    holds something not understood (a privilege of another object kind)."""
    out: list[tuple[str, list[str]]] = []
    for part in _OUTSIDE_PARENS.split(text):
        match = _PRIVILEGE.match(" ".join(part.split()))
        if match is None:
            return None
        word = match["word"].upper()
        columns = _names(match["columns"]) if match["columns"] is not None else []
        if columns is None or (columns and kind != "table"):
            return None
        if word in ("ALL", "ALL PRIVILEGES"):
            valid = _ALL_PRIVILEGES["column" if columns else kind]
            out += [(w, columns) for w in valid]
        elif word in _ALL_PRIVILEGES["column" if columns else kind]:
            out.append((word, columns))
        else:
            return None
    return out


def expected(
    sql: str,
    schema_tables: dict[str, list[str]] | None = None,
    schema_sequences: dict[str, list[str]] | None = None,
) -> Expected:
    """The privileges ``sql`` leaves in place, statement by statement. Pure.

    ``schema_tables``/``schema_sequences`` expand ``ALL TABLES IN SCHEMA s`` (schema name
    to its objects, as the database lists them).
    """
    out = Expected()
    text = re.sub(r"--[^\n]*", "", sql)
    for created in _CREATE_ROLE.finditer(text):
        role = _unquote(created[1])
        if role not in out.roles:
            out.roles.append(role)
    for statement in text.split(";"):
        if re.search(r"\bDEFAULT\s+PRIVILEGES\b", statement, re.I):
            out.skipped += bool(re.search(r"\b(GRANT|REVOKE)\b", statement, re.I))
            continue
        grant = _GRANT.search(statement)
        match = grant if grant is not None else _REVOKE.search(statement)
        if match is None:
            continue
        parsed = _targets(match["target"], schema_tables or {}, schema_sequences or {})
        roles = _names(match["roles"])
        privs = _privileges(match["privs"], parsed[0]) if parsed else None
        if parsed is None or roles is None or privs is None:
            out.skipped += 1
            continue
        kind, objects = parsed
        for role in roles:
            if role not in ("current_user", "session_user", "current_role"):
                for obj in objects:
                    _set(out.privileges, role, kind, obj, privs, grant is not None)
    for p, held in out.privileges.items():
        # a column holds what its table holds: a column's REVOKE under the table's GRANT
        # leaves it (has_column_privilege says so)
        if p.kind == "column" and not held:
            out.privileges[p] = out.privileges.get(
                Privilege(p.role, "table", p.obj, p.privilege), False
            )
    return out


def _set(
    privileges: dict[Privilege, bool],
    role: str,
    kind: Kind,
    obj: str,
    privs: list[tuple[str, list[str]]],
    held: bool,
) -> None:
    """One statement's privileges on one object for one role, into ``privileges``."""
    for priv, columns in privs:
        if not columns:
            privileges[Privilege(role, kind, obj, priv)] = held
        if not columns and not held and kind == "table":
            # a table's REVOKE takes the privilege from its columns too
            for p in privileges:
                if (p.role, p.kind, p.obj, p.privilege) == (role, "column", obj, priv):
                    privileges[p] = False
        for column in columns:
            privileges[Privilege(role, "column", obj, priv, column)] = held


# NULL where a column or function does not exist (the functions of the table, sequence
# and schema kinds would raise: those objects are checked against the catalogue's list
# first; a function comes as its OID, read by _FUNCTION_OID)
_HOLDS = """
SELECT CASE u.kind
         WHEN 'table' THEN has_table_privilege(u.role, u.obj, u.priv)
         WHEN 'sequence' THEN has_sequence_privilege(u.role, u.obj, u.priv)
         WHEN 'column' THEN (
             SELECT has_column_privilege(u.role, a.attrelid, a.attnum, u.priv)
             FROM pg_attribute a
             WHERE a.attrelid = to_regclass(u.obj) AND a.attname = u.col
               AND a.attnum > 0 AND NOT a.attisdropped)
         WHEN 'columns' THEN has_any_column_privilege(u.role, u.obj, u.priv)
         WHEN 'function' THEN has_function_privilege(u.role, u.fn, u.priv)
         ELSE has_schema_privilege(u.role, u.obj, u.priv)
       END AS held
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::oid[])
    WITH ORDINALITY AS u(role, kind, obj, priv, col, fn, n)
ORDER BY u.n
"""

# Raises (PostgreSQL 15) on a signature it cannot read, such as one naming its arguments
_FUNCTION_OID = "SELECT to_regprocedure($1)::oid"

_OBJECTS = """
SELECT n.nspname AS schema, c.relname AS name, c.relkind AS kind
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S')
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_%'
"""


_WRITES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")


def with_no_extra_writes(want: Expected, tables: dict[str, list[str]]) -> dict[Privilege, bool]:
    """``want``'s privileges, plus: a role the file grants table privileges to holds no
    write privilege on any table that the file does not grant it. Pure.

    This is what makes "append-only by grants" checkable: the ingest role may INSERT
    into activity, and holding UPDATE or DELETE there is a failure.
    """
    expect = dict(want.privileges)
    grantees = {p.role for p, granted in want.privileges.items() if granted and p.kind == "table"}
    # a column's INSERT or UPDATE the file grants (the eraser's UPDATE of body columns)
    by_column = {
        (p.role, p.obj, p.privilege)
        for p, granted in want.privileges.items()
        if granted and p.kind == "column"
    }
    for role in sorted(grantees - {"public"}):
        for schema, names in tables.items():
            for name in names:
                obj = name if schema == "public" else f"{schema}.{name}"
                for priv in _WRITES:
                    table = Privilege(role, "table", obj, priv)
                    expect.setdefault(table, False)
                    # one column's UPDATE rewrites rows as the table's does, and
                    # has_table_privilege does not see it
                    if (
                        priv in _ALL_PRIVILEGES["columns"]
                        and not expect[table]
                        and (role, obj, priv) not in by_column
                    ):
                        expect.setdefault(Privilege(role, "columns", obj, priv), False)
    return expect


_PARTITIONS = """
WITH RECURSIVE tree AS (
    SELECT inhrelid, inhparent FROM pg_inherits
    UNION ALL
    SELECT i.inhrelid, t.inhparent FROM pg_inherits i JOIN tree t ON i.inhparent = t.inhrelid
)
SELECT inhrelid::regclass::text AS child, inhparent::regclass::text AS parent FROM tree
"""


async def check_roles(
    conn: asyncpg.Connection,
    migration: Migration,
    applied: bool,
    owned: set[str] | None = None,
) -> RolesReport:
    """Compare the database's roles and privileges with ``migration``'s. Read-only.

    Checked: every role the file creates or grants to exists; every privilege the file
    leaves granted is held, every one it revokes is not; and no grantee of table
    privileges holds a write privilege the file does not grant it on a table of
    ``owned`` (the migrations' tables, :func:`migration_tables`, and their partitions;
    None: every table). A write held on any other table (a processor's own, granted by
    its ``setup_sql``) is reported in ``outside``, not as wrong.
    """
    tables: dict[str, list[str]] = {}
    sequences: dict[str, list[str]] = {}
    for r in await conn.fetch(_OBJECTS):
        target = sequences if r["kind"] == b"S" or r["kind"] == "S" else tables
        target.setdefault(str(r["schema"]), []).append(str(r["name"]))
    want = expected(migration.sql, tables, sequences)
    named = sorted(({p.role for p in want.privileges} | set(want.roles)) - {"public"})
    present = {
        str(r["rolname"])
        for r in await conn.fetch("SELECT rolname FROM pg_roles WHERE rolname = ANY($1)", named)
    } | {"public"}
    known = {o for objs in (*tables.values(), *sequences.values()) for o in objs}
    known |= {f"{s}.{o}" for s, objs in (*tables.items(), *sequences.items()) for o in objs}
    known |= {str(r["nspname"]) for r in await conn.fetch("SELECT nspname FROM pg_namespace")}
    expect = with_no_extra_writes(want, tables)
    functions, unchecked = await _function_oids(
        conn, {p.obj for p in expect if p.kind == "function"}
    )
    checkable = [
        p
        for p in expect
        if p.role in present
        and (p.obj in known or (p.kind == "function" and p.obj not in unchecked))
    ]
    held = await conn.fetch(
        _HOLDS,
        [p.role for p in checkable],
        [p.kind for p in checkable],
        [p.obj for p in checkable],
        [p.privilege for p in checkable],
        [p.column for p in checkable],
        [functions.get(p.obj) if p.kind == "function" else None for p in checkable],
    )
    if owned is not None:
        owned = set(owned)
        for r in await conn.fetch(_PARTITIONS):
            if str(r["parent"]) in owned:
                owned.add(str(r["child"]))
    wrong: list[tuple[Privilege, bool]] = []
    outside: list[Privilege] = []
    for p, h in zip(checkable, held, strict=True):
        if h["held"] is None:  # a column or function that does not exist
            if expect[p]:
                wrong.append((p, False))
            continue
        if bool(h["held"]) == expect[p]:
            continue
        if owned is not None and p not in want.privileges and p.obj not in owned:
            outside.append(p)  # a table no migration creates: not the file's to judge
        else:
            wrong.append((p, bool(h["held"])))
    # a stray write on the table also holds on every column: said once, as the table's
    tables_wrong = {(p.role, p.obj, p.privilege) for p, _ in wrong if p.kind == "table"}
    wrong = [
        (p, h)
        for p, h in wrong
        if p.kind != "columns" or (p.role, p.obj, p.privilege) not in tables_wrong
    ]
    wrong += [
        (p, False)
        for p in want.privileges
        if p.kind != "function" and p.obj not in known and want.privileges[p]
    ]
    return RolesReport(
        migration=f"{migration.version:04d}_{migration.name}.sql",
        applied=applied,
        expected=want,
        missing_roles=[r for r in named if r not in present],
        wrong=wrong,
        outside=outside,
        unchecked=sorted(unchecked),
    )


async def _function_oids(
    conn: asyncpg.Connection, signatures: set[str]
) -> tuple[dict[str, int | None], set[str]]:
    """Each function's OID (None: no such function), and the signatures PostgreSQL
    could not read. One at a time: one unreadable signature fails its statement only."""
    oids: dict[str, int | None] = {}
    unreadable: set[str] = set()
    for signature in sorted(signatures):
        try:
            oid = await conn.fetchval(_FUNCTION_OID, signature)
        except asyncpg.PostgresError:
            unreadable.add(signature)
            continue
        oids[signature] = None if oid is None else int(oid)
    return oids, unreadable


async def may_modify_activity(conn: asyncpg.Connection) -> tuple[str, list[str]]:
    """(current_user, the privileges among UPDATE/DELETE/TRUNCATE it holds on activity);
    UPDATE of any one column counts (has_table_privilege does not see it)."""
    row = await conn.fetchrow(
        "SELECT current_user AS who, "
        "has_any_column_privilege('activity', 'UPDATE') AS u, "
        "has_table_privilege('activity', 'DELETE') AS d, "
        "has_table_privilege('activity', 'TRUNCATE') AS t"
    )
    if row is None:  # a SELECT without FROM always returns one row
        return "?", []
    held = [name for name, key in (("UPDATE", "u"), ("DELETE", "d"), ("TRUNCATE", "t")) if row[key]]
    return str(row["who"]), held
