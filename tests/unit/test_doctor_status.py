"""The doctor's checks, the roles-migration reader, status merging, the worker's lag and
safe rendering: pure functions, tested without services."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest

from ackline import doctor
from ackline.render import safe_text, show_bytes, table
from ackline.sinks.admin.grants import (
    Expected,
    Privilege,
    RolesReport,
    expected,
    grants_model,
    migration_tables,
    roles_migration,
    with_no_extra_writes,
)
from ackline.sinks.admin.migrate import Migration, load_migrations
from ackline.status import OffsetRow, PartitionStatus, merge
from ackline.streams.kafkainfo import PartitionOffsets, TopicFacts
from ackline.streams.lag import partition_lag, stable_offsets

FILES = [Migration(1, "init", "CREATE TABLE a ();"), Migration(2, "more", "CREATE TABLE b ();")]


def test_migrations_check() -> None:
    applied = {m.version: m.sha256 for m in FILES}
    assert doctor.migrations_check(FILES, applied).status == "pass"
    missing = doctor.migrations_check(FILES, {1: FILES[0].sha256})
    assert (missing.status, "0002_more.sql" in missing.detail) == ("fail", True)
    changed = doctor.migrations_check(FILES, {**applied, 2: "0" * 64})
    assert changed.status == "fail"
    assert "changed" in changed.detail
    assert doctor.migrations_check(FILES, None).status == "fail"
    newer = doctor.migrations_check(FILES, {**applied, 9: "x"})
    assert newer.status == "warn"


def test_shipped_migrations_pass_against_their_own_checksums() -> None:
    files = load_migrations()
    assert doctor.migrations_check(files, {m.version: m.sha256 for m in files}).status == "pass"


ROLES_SQL = """
-- roles for ackline
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ackline_ingest') THEN
    CREATE ROLE ackline_ingest NOLOGIN;
  END IF;
END $$;
CREATE ROLE "Ackline_Reader";
GRANT SELECT, INSERT ON activity, txn_ledger TO ackline_ingest;
GRANT ALL ON TABLE consumer_offsets TO ackline_ingest;
REVOKE DELETE, TRUNCATE ON consumer_offsets FROM ackline_ingest;
GRANT USAGE ON SEQUENCE ingest_batch_id_seq TO ackline_ingest;
GRANT USAGE ON SCHEMA public TO ackline_ingest, "Ackline_Reader";
GRANT SELECT ON ALL TABLES IN SCHEMA public TO "Ackline_Reader";
GRANT SELECT (event_id) ON activity TO ackline_ingest;
GRANT SELECT (a, "B"), UPDATE (c) ON TABLE rejects, conflicts TO ackline_ingest;
REVOKE UPDATE (c) ON conflicts FROM ackline_ingest;
GRANT EXECUTE ON FUNCTION f(text, integer), public."G"( timestamp with time zone )
    TO ackline_ingest;
GRANT ALL ON FUNCTION h() TO "Ackline_Reader";
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO ackline_ingest;
ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO "Ackline_Reader";
EXECUTE format('GRANT SELECT ON %I TO x', t);
GRANT ackline_ingest TO app_user;
"""


def test_expected_privileges_follow_the_file_in_order() -> None:
    want = expected(ROLES_SQL, {"public": ["activity", "conflicts"]})
    assert want.roles == ["ackline_ingest", "Ackline_Reader"]
    p = want.privileges
    assert p[Privilege("ackline_ingest", "table", "activity", "INSERT")] is True
    assert p[Privilege("ackline_ingest", "table", "consumer_offsets", "UPDATE")] is True
    assert p[Privilege("ackline_ingest", "table", "consumer_offsets", "DELETE")] is False
    assert p[Privilege("ackline_ingest", "sequence", "ingest_batch_id_seq", "USAGE")] is True
    assert p[Privilege("Ackline_Reader", "schema", "public", "USAGE")] is True
    assert p[Privilege("Ackline_Reader", "table", "conflicts", "SELECT")] is True
    assert Privilege("ackline_ingest", "table", "activity", "UPDATE") not in p
    # column privileges (doctor skipped them, and a revoked one passed)
    assert p[Privilege("ackline_ingest", "column", "activity", "SELECT", "event_id")] is True
    assert p[Privilege("ackline_ingest", "column", "rejects", "SELECT", "B")] is True
    assert p[Privilege("ackline_ingest", "column", "conflicts", "UPDATE", "c")] is False
    assert p[Privilege("ackline_ingest", "column", "rejects", "UPDATE", "c")] is True
    assert Privilege("ackline_ingest", "table", "rejects", "SELECT") not in p
    # function privileges (skipped too), named as to_regprocedure reads them
    assert p[Privilege("ackline_ingest", "function", "f(text, integer)", "EXECUTE")] is True
    g = 'public."G"(timestamp with time zone)'
    assert p[Privilege("ackline_ingest", "function", g, "EXECUTE")] is True
    assert p[Privilege("Ackline_Reader", "function", "h()", "EXECUTE")] is True
    # functions by schema, default privileges and dynamic SQL are not checked, and counted
    assert want.skipped == 3


def test_roles_migration_is_found_by_name() -> None:
    assert roles_migration(FILES) is None
    roles = Migration(3, "roles", ROLES_SQL)
    assert roles_migration([*FILES, roles]) is roles


def test_the_grants_model_adds_the_grants_of_later_migrations_that_are_applied() -> None:
    """Doctor compared the database with the roles migration alone: a privilege a later
    migration granted (0016: the ingest role's SELECT on topic_incarnations, without
    which a batch with a reject stops the worker) could be missing while it passed."""
    roles = Migration(3, "roles", ROLES_SQL)
    later = Migration(4, "more", "GRANT SELECT ON TABLE extra TO ackline_ingest;")
    unapplied = Migration(5, "next", "GRANT SELECT ON TABLE other TO ackline_ingest;")
    files = [*FILES, roles, later, unapplied]
    model = grants_model(files, {1, 2, 3, 4})
    assert model is not None and model.version == 3
    assert model.name == "roles.sql and the grants of 0004-0004"
    want = expected(model.sql).privileges
    assert want[Privilege("ackline_ingest", "table", "extra", "SELECT")] is True
    assert Privilege("ackline_ingest", "table", "other", "SELECT") not in want
    assert want[Privilege("ackline_ingest", "table", "activity", "INSERT")] is True  # its own
    assert grants_model(files, {1, 2, 3}) is roles
    assert grants_model(FILES, None) is None


def _report(**changes: object) -> RolesReport:
    want = expected(ROLES_SQL, {"public": ["activity"]})
    base: dict[str, object] = {
        "migration": "0003_roles.sql",
        "applied": True,
        "expected": want,
        "missing_roles": [],
        "wrong": [],
    }
    base.update(changes)
    return RolesReport(**base)  # type: ignore[arg-type]


def test_roles_check() -> None:
    assert doctor.roles_check(None).status == "warn"
    assert doctor.roles_check(_report(applied=False)).status == "warn"
    assert doctor.roles_check(_report(expected=Expected())).status == "warn"
    assert doctor.roles_check(_report()).status == "pass"
    missing = doctor.roles_check(_report(missing_roles=["ackline_ingest"]))
    assert missing.status == "fail"
    assert "ackline_ingest" in missing.detail
    held = Privilege("ackline_ingest", "table", "activity", "UPDATE")
    wrong = doctor.roles_check(_report(wrong=[(held, True)]))
    assert wrong.status == "fail"
    assert "UPDATE on table activity is held" in wrong.detail


def test_writes_on_tables_no_migration_creates_are_information() -> None:
    """A processor's setup_sql grants writes on its own table (docs/processors.md):
    the roles check says so, and passes."""
    mine = [
        Privilege("ackline_processor", "table", "daily_tool_calls", "INSERT"),
        Privilege("ackline_processor", "table", "daily_tool_calls", "UPDATE"),
    ]
    check = doctor.roles_check(_report(outside=mine))
    assert check.status == "pass"
    assert check.detail.endswith(
        "also held, on tables no migration creates (not checked): "
        "ackline_processor: INSERT, UPDATE on daily_tool_calls"
    )
    held = Privilege("ackline_ingest", "table", "activity", "UPDATE")
    assert doctor.roles_check(_report(wrong=[(held, True)], outside=mine)).status == "fail"


def test_the_migrations_tables() -> None:
    files = [
        Migration(1, "a", "CREATE TABLE t1 (x int);\n-- CREATE TABLE not_this (x int)\n"),
        Migration(2, "b", "CREATE TABLE IF NOT EXISTS public.t2 (x int) PARTITION BY RANGE (x);"),
        Migration(3, "c", "CREATE VIEW v AS SELECT 1; ALTER TABLE t1 RENAME TO t3;"),
        Migration(4, "d", "EXECUTE format('CREATE TABLE public.%I (LIKE public.t2)', n);"),
    ]
    assert migration_tables(files) == {"schema_migrations", "t1", "t2", "v", "t3"}
    shipped = migration_tables(load_migrations())
    assert {"activity", "consumer_offsets", "feed_cursors", "run_facts"} <= shipped
    assert "daily_tool_calls" not in shipped


def test_append_only_check() -> None:
    assert doctor.append_only_check("ingest", []).status == "pass"
    bad = doctor.append_only_check("postgres", ["UPDATE", "DELETE"])
    assert bad.status == "fail"
    assert "UPDATE/DELETE" in bad.detail


def facts(rf: int = 3, min_isr: str = "2", retention: str = "604800000") -> TopicFacts:
    return TopicFacts("t", 3, rf, 3, {"min.insync.replicas": min_isr, "retention.ms": retention})


@pytest.mark.parametrize(
    ("rf", "min_isr", "status", "words"),
    [
        (3, "2", "pass", "replication factor 3"),
        (1, "1", "warn", "use 3"),
        (3, "1", "warn", "one broker only"),
        (2, "2", "warn", "stops every producer"),
        (1, "2", "fail", "can never write"),
    ],
)
def test_replication_check(rf: int, min_isr: str, status: str, words: str) -> None:
    check = doctor.replication_check(facts(rf, min_isr))
    assert check.status == status
    assert words in check.detail


def test_partitions_and_dlq_checks() -> None:
    assert doctor.partitions_check("t", None).status == "fail"
    assert doctor.partitions_check("t", facts()).detail == "t: 3 partitions"
    assert doctor.dlq_check("t.dlq", True).status == "pass"
    assert doctor.dlq_check("t.dlq", False).status == "warn"


def row(p: int, db_next: int | None, low: int = 0, high: int = 100) -> PartitionStatus:
    lag = None if db_next is None else high - db_next
    return PartitionStatus(p, db_next, None, low, high, lag, 1, "w", None)


def test_offsets_check() -> None:
    assert doctor.offsets_check([row(0, 100), row(1, None)], 3).status == "pass"
    below = doctor.offsets_check([row(0, 5, low=20)], 3)
    assert below.status == "fail"
    assert "records 5..19 were deleted" in below.detail
    past = doctor.offsets_check([row(0, 500)], 3)
    assert (past.status, "past the log end" in past.detail) == ("fail", True)
    gone = doctor.offsets_check([row(7, 5)], 3)
    assert gone.status == "fail"


def test_retention_check() -> None:
    week = facts().config
    now = 10 * 86_400_000
    assert doctor.retention_check(week, {}, now).status == "pass"
    assert doctor.retention_check(week, {0: now - 60_000}, now).status == "pass"
    old = doctor.retention_check(week, {0: now - 60_000, 1: now - 4 * 86_400_000}, now)
    assert (old.status, "partition 1" in old.detail) == ("warn", True)
    assert doctor.retention_check(week, {2: now - 8 * 86_400_000}, now).status == "fail"
    assert doctor.retention_check({"retention.ms": "-1"}, {0: 0}, now).status == "pass"


def test_exit_status_and_json() -> None:
    ok = [doctor.Check("a", "pass", ""), doctor.Check("b", "warn", "")]
    assert doctor.exit_status(ok) == 0
    bad = [*ok, doctor.Check("c", "fail", "x")]
    assert doctor.exit_status(bad) == 1
    assert doctor.to_json(bad)["ok"] is False
    assert "FAIL  c" in doctor.render(bad)


def test_status_merge() -> None:
    stamp = datetime(2026, 1, 1, tzinfo=UTC)
    db = [OffsetRow(0, 90, 3, "w1", stamp), OffsetRow(1, None, 1, "w2", None)]
    kafka = [
        PartitionOffsets(0, 0, 100, 85),
        PartitionOffsets(1, 10, 40, None),
        PartitionOffsets(2, 0, 7, None),
    ]
    rows = merge(db, kafka)
    assert [r.partition for r in rows] == [0, 1, 2]
    assert (rows[0].db_next, rows[0].kafka_committed, rows[0].lag, rows[0].epoch) == (90, 85, 10, 3)
    assert rows[1].lag == 30  # nothing committed: everything from the log start
    assert (rows[2].owner, rows[2].lag) == (None, 7)
    assert rows[0].to_json()["updated_at"] == "2026-01-01T00:00:00+00:00"


def test_safe_rendering_of_hostile_bytes() -> None:
    hostile = b"ok\x1b[31mred\x07\xff\xfe\n\xe2\x80\xaeevil"
    text = show_bytes(hostile)
    assert "\x1b" not in text
    assert "\x07" not in text
    assert "\\x1b[31mred" in text
    assert "\ufffd" in text  # invalid UTF-8 replaced
    assert "\\u202e" in text  # bidi override shown, not obeyed
    assert base64.b64decode(show_bytes(hostile, raw=True)) == hostile
    cut = show_bytes(b"x" * 10, limit=4)
    assert cut.startswith("xxxx\n")
    assert "6 more bytes" in cut
    assert show_bytes(None) == "(null)"
    assert safe_text("a\tb") == "a\\x09b"


def test_table_pads_columns() -> None:
    out = table(("a", "long header"), [(1, None), ("wide value", 2)])
    lines = out.splitlines()
    assert lines[0] == "a           long header"
    assert lines[2] == "1           -"
    assert lines[3] == "wide value  2"


def test_grantees_may_hold_no_write_the_file_does_not_grant() -> None:
    want = expected(
        "GRANT SELECT, INSERT ON activity TO ingest; GRANT USAGE ON SCHEMA public TO other;",
    )
    expect = with_no_extra_writes(want, {"public": ["activity", "offsets"], "audit": ["log"]})
    assert expect[Privilege("ingest", "table", "activity", "INSERT")] is True
    assert expect[Privilege("ingest", "table", "activity", "UPDATE")] is False
    assert expect[Privilege("ingest", "table", "activity", "DELETE")] is False
    assert expect[Privilege("ingest", "table", "offsets", "INSERT")] is False
    assert expect[Privilege("ingest", "table", "audit.log", "TRUNCATE")] is False
    assert not any(p.role == "other" and p.kind == "table" for p in expect)  # no table grants


def test_column_privileges_follow_postgresqls_rules_and_public_is_checked() -> None:
    """As PostgreSQL keeps them: a table's REVOKE takes the privilege from its columns
    too, and a column's REVOKE under the table's GRANT leaves the column holding it (a
    model that disagreed failed a database exactly as its migrations left it). PUBLIC's
    grants and revokes are checked (a stray EXECUTE to PUBLIC on a SECURITY DEFINER
    function), where they were dropped without even being counted."""
    want = expected(
        "GRANT SELECT (a) ON t TO r; REVOKE ALL ON t FROM r; "
        "GRANT ALL ON u TO r; REVOKE UPDATE (c) ON u FROM r; "
        "REVOKE ALL ON FUNCTION f() FROM PUBLIC;"
    ).privileges
    assert want[Privilege("r", "column", "t", "SELECT", "a")] is False
    assert want[Privilege("r", "column", "u", "UPDATE", "c")] is True
    assert want[Privilege("public", "function", "f()", "EXECUTE")] is False


def test_a_write_to_one_column_the_file_does_not_grant_is_a_failure() -> None:
    """``GRANT UPDATE (payload) ON activity`` rewrites rows as a table's UPDATE does, and
    has_table_privilege does not see it: a grantee must hold no INSERT or UPDATE on any
    column of a table where the file grants it none (the eraser's column UPDATEs are
    the file's own)."""
    want = expected(
        "GRANT SELECT, INSERT ON activity TO ingest; "
        "GRANT SELECT ON conflicts TO eraser; GRANT UPDATE (body) ON conflicts TO eraser;"
    )
    expect = with_no_extra_writes(want, {"public": ["activity", "conflicts"]})
    assert expect[Privilege("ingest", "columns", "activity", "UPDATE")] is False
    assert Privilege("ingest", "columns", "activity", "INSERT") not in expect  # granted
    assert Privilege("eraser", "columns", "conflicts", "UPDATE") not in expect  # the file's
    assert expect[Privilege("eraser", "columns", "conflicts", "INSERT")] is False
    said = Privilege("ingest", "columns", "activity", "UPDATE").said
    assert said == "UPDATE on a column of activity"


def test_the_shipped_roles_migration_is_readable() -> None:
    roles = roles_migration(load_migrations())
    if roles is None:  # the check is data-driven: without the file there is nothing to read
        assert doctor.roles_check(None).status == "warn"
        return
    want = expected(roles.sql, {"public": ["activity"]})
    assert want.privileges, f"no GRANT read from {roles.name}"
    # Only the eraser (`ackline erase`) may delete activity rows; nobody may rewrite them.
    assert not any(
        granted
        and p.obj == "activity"
        and p.privilege in ("UPDATE", "DELETE", "TRUNCATE")
        and (p.role, p.privilege) != ("ackline_eraser", "DELETE")
        for p, granted in want.privileges.items()
    )


def test_stable_offsets_are_read_from_librdkafka_statistics() -> None:
    """ls_offset per partition; the internal unassigned partition (-1) and partitions not
    fetched yet (-1001) are left out, and so is anything malformed."""
    stats = json.loads(
        json.dumps(
            {
                "topics": {
                    "t": {
                        "partitions": {
                            "0": {"partition": 0, "hi_offset": 5, "ls_offset": 4},
                            "1": {"partition": 1, "hi_offset": -1001, "ls_offset": -1001},
                            "-1": {"partition": -1, "hi_offset": -1001, "ls_offset": -1001},
                            "2": {"partition": 2, "ls_offset": "7"},
                        }
                    },
                    "u": {"partitions": []},
                    "v": "x",
                }
            }
        )
    )
    assert stable_offsets(stats) == {("t", 0): 4}
    assert stable_offsets({}) == {}
    assert stable_offsets({"topics": []}) == {}


def test_partition_lag_counts_to_the_stable_offset() -> None:
    # drained to the commit marker at 3, a record at 4 in a transaction still open: the
    # LSO is 4, the position 4 (past the marker): nothing a read_committed reader can read
    assert partition_lag(4, 3, 4, pending=False) == 0
    # records 4 and 5 read and buffered, the LSO 6: counted from the DB next offset (the
    # marker at 3 included: an upper bound while a batch is on its way)
    assert partition_lag(6, 3, 6, pending=True) == 3
    assert partition_lag(10, 3, 5, pending=False) == 5
    assert partition_lag(2, 3, None, pending=False) == 0  # a stale LSO is never negative


def test_a_group_without_db_offsets_warns() -> None:
    """No offset row for the group: the offsets check warns, naming the groups that have
    some (it passed, "DB offsets inside the log", for a mistyped group id)."""
    from ackline.status import OffsetRow, no_offsets_note

    none = no_offsets_note([], "nosuch", "t", ["g1", "nosuch", "g2"])
    assert none is not None
    assert "no DB offsets for group nosuch on topic t" in none
    assert none.endswith("groups with offsets for it: g1, g2")
    many = no_offsets_note([], "x", "t", [f"g{i}" for i in range(6)])
    assert many is not None and many.endswith("g0, g1, g2, g3, g4, ...")
    assert no_offsets_note([], "x", "t", []) is not None
    assert "no group has offsets for it" in str(no_offsets_note([], "x", "t", []))
    assert no_offsets_note([OffsetRow(0, 5, 1, "w", None)], "x", "t", []) is None
    check = doctor.offsets_check([row(0, None), row(1, None)], 3, none)
    assert check.status == "warn"
    assert check.detail.startswith("no DB offsets for group nosuch")
    assert "lag 0 counted from the log start" in check.detail


def test_incarnation_check() -> None:
    """An operator's hunt: after the topic was made again, doctor passed once the new log
    grew past the old offsets (the worker refused to start all the while)."""
    other = doctor.incarnation_check("t", "g", "NEW", "OLD")
    assert other.status == "fail"
    assert "OLD" in other.detail and "NEW" in other.detail
    assert "ackline offsets adopt-topic --topic t --group-id g" in other.detail
    assert doctor.incarnation_check("t", "g", "A", "A").status == "pass"
    assert doctor.incarnation_check("t", "g", "A", None).status == "pass"  # a start records
    assert doctor.incarnation_check("t", "g", None, "A").status == "warn"  # not checked
    # no migration 0015: nothing recorded and nothing will be (a review: it said pass)
    assert doctor.incarnation_check("t", "g", "A", None, migrated=False).status == "skip"
