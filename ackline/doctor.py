"""`ackline doctor`: is this deployment able to keep ackline's promises?

Each check is a pure function of facts gathered read-only from Kafka and PostgreSQL
(:func:`gather`), and says pass, warn, fail, or skip (a check whose service could not
be reached, already reported as a fail). The exit status is 1 when any check fails.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import asyncpg

from ackline.clients import ingest_dsn, kafka_client_config
from ackline.core.errors import AcklineError
from ackline.core.signals import run_stoppable
from ackline.render import table
from ackline.settings import Settings, dsn_hint
from ackline.sinks.admin.grants import (
    RolesReport,
    check_roles,
    grants_model,
    may_modify_activity,
    migration_tables,
)
from ackline.sinks.admin.migrate import Migration, load_migrations
from ackline.sinks.ingest import incarnation
from ackline.sinks.ingest.incarnation import other_incarnation_line
from ackline.status import (
    OffsetRow,
    PartitionStatus,
    db_offsets,
    groups_with_offsets,
    merge,
    no_offsets_note,
    unread_starts,
)
from ackline.streams.dlq_rules import weaker_than_source
from ackline.streams.errors import KafkaUnavailableError
from ackline.streams.kafkainfo import (
    TopicFacts,
    describe_topic,
    reachable,
    scan_ranges,
    topic_id,
    topic_offsets,
)

Status = Literal["pass", "warn", "fail", "skip"]
_DAY_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    detail: str


# ---- pure checks -------------------------------------------------------------------------


def migrations_check(files: Sequence[Migration], applied: dict[int, str] | None) -> Check:
    """Every file in schemas/sql applied, with the checksum it has now."""
    name = "migrations"
    if applied is None:
        return Check(name, "fail", "no schema_migrations table: run `ackline migrate`")
    label = {m.version: f"{m.version:04d}_{m.name}.sql" for m in files}
    pending = [label[m.version] for m in files if m.version not in applied]
    changed = [label[m.version] for m in files if applied.get(m.version, m.sha256) != m.sha256]
    unknown = sorted(set(applied) - set(label))
    if changed:
        return Check(name, "fail", f"changed after they were applied: {', '.join(changed)}")
    if pending:
        return Check(name, "fail", f"pending: {', '.join(pending)}: run `ackline migrate`")
    if unknown:
        return Check(
            name, "warn", f"applied versions this ackline does not ship: {unknown} (newer build?)"
        )
    return Check(name, "pass", f"all {len(files)} migrations applied, checksums match")


def roles_check(report: RolesReport | None) -> Check:
    """The roles and privileges of the roles migration hold in the database."""
    name = "roles and grants"
    if report is None:
        return Check(
            name, "warn", "no roles migration in schemas/sql: grants are not managed by ackline"
        )
    if not report.applied:
        return Check(name, "warn", f"{report.migration} is not applied yet")
    want = report.expected
    if not want.privileges and not want.roles:
        return Check(name, "warn", f"found no CREATE ROLE or GRANT to check in {report.migration}")
    problems = [f"role {r} does not exist" for r in report.missing_roles]
    for p, held in report.wrong[:5]:
        state = "held" if held else "missing"
        problems.append(f"{p.role}: {p.said} is {state}")
    if len(report.wrong) > 5:
        problems.append(f"and {len(report.wrong) - 5} more")
    outside = _outside(report)
    if problems:
        detail = f"{report.migration} disagrees: " + "; ".join(problems)
        return Check(name, "fail", detail + (f" ({outside})" if outside else ""))
    roles = sorted(({p.role for p in want.privileges} | set(want.roles)) - {"public"})
    note = f" ({want.skipped} statements not checked)" if want.skipped else ""
    if report.unchecked:
        note += f" (not checked, a signature PostgreSQL cannot read: {', '.join(report.unchecked)})"
    return Check(
        name,
        "pass",
        f"roles {', '.join(roles)}: {len(want.privileges)} privileges as {report.migration} "
        f"sets them{note}" + (f"; {outside}" if outside else ""),
    )


def _outside(report: RolesReport) -> str:
    """The writes held on tables no migration creates (a processor's setup_sql grants
    them on its own tables, docs/processors.md), for information."""
    held: dict[tuple[str, str], list[str]] = {}
    for p in report.outside:
        privileges = held.setdefault((p.role, p.obj), [])
        if p.privilege not in privileges:  # the table's and any column's: one word
            privileges.append(p.privilege)
    if not held:
        return ""
    return "also held, on tables no migration creates (not checked): " + "; ".join(
        f"{role}: {', '.join(privs)} on {obj}" for (role, obj), privs in sorted(held.items())
    )


def append_only_check(user: str, held: Sequence[str]) -> Check:
    """The role the worker connects as cannot rewrite activity rows (append-only by grants)."""
    name = "append-only"
    if held:
        return Check(
            name,
            "fail",
            f"the worker connects as {user}, which may {'/'.join(held)} activity rows",
        )
    return Check(name, "pass", f"the worker connects as {user}, which cannot rewrite activity")


def partitions_check(topic: str, facts: TopicFacts | None) -> Check:
    if facts is None:
        return Check("topic", "fail", f"topic {topic} does not exist")
    return Check("topic", "pass", f"{topic}: {facts.partitions} partitions")


def replication_check(facts: TopicFacts) -> Check:
    """Replication factor and min.insync.replicas that keep acknowledged events."""
    name = "replication"
    rf = facts.replication_factor
    min_isr = int(facts.config.get("min.insync.replicas", "1"))
    head = f"replication factor {rf}, min.insync.replicas {min_isr}"
    if min_isr > rf:
        return Check(name, "fail", f"{head}: acks=all producers can never write")
    warnings = []
    if rf < 3:
        warnings.append("losing one broker can lose acknowledged events (use 3)")
    if min_isr < 2:
        warnings.append("an acknowledged write may live on one broker only (use 2)")
    if 1 < rf == min_isr:
        warnings.append("one broker down stops every producer")
    if warnings:
        return Check(name, "warn", f"{head}: " + "; ".join(warnings))
    return Check(name, "pass", head)


def offsets_check(
    rows: Sequence[PartitionStatus], partitions: int, missing: str | None = None
) -> Check:
    """DB offsets lie inside the log: not below its start (lost), not past its end.

    ``missing`` (:func:`ackline.status.no_offsets_note`): the group has no DB offset at
    all, a warning: "inside the log" would be true of nothing, and a mistyped group id
    passed as a healthy one."""
    name = "offsets"
    problems = []
    for r in rows:
        if r.db_next is None:
            continue
        if r.partition >= partitions:
            problems.append(f"partition {r.partition} has a DB offset but is not in the topic")
        elif r.low is not None and r.db_next < r.low:
            problems.append(
                f"partition {r.partition}: DB next offset {r.db_next} is below the log start "
                f"{r.low}: records {r.db_next}..{r.low - 1} were deleted before ingest"
            )
        elif r.high is not None and r.db_next > r.high:
            problems.append(
                f"partition {r.partition}: DB next offset {r.db_next} is past the log end "
                f"{r.high} (topic recreated? see the topic incarnation check)"
            )
    if problems:
        return Check(name, "fail", "; ".join(problems))
    lag = sum(r.lag or 0 for r in rows)
    if missing is not None:
        return Check(name, "warn", f"{missing}; lag {lag} counted from the log start")
    return Check(name, "pass", f"DB offsets inside the log on {len(rows)} partitions, lag {lag}")


def incarnation_check(
    topic: str, group: str, current: str | None, recorded: str | None, migrated: bool = True
) -> Check:
    """The group's DB offsets belong to the topic's incarnation in Kafka (its topic ID):
    another one means the topic was deleted and made again, and a worker refuses to start
    (the offsets check alone passed once the new log grew past the old offsets)."""
    name = "topic incarnation"
    if not migrated:  # nothing recorded, and a start records nothing: not a pass
        return Check(name, "skip", "no topic_incarnations table (migration 0015)")
    if current is None:
        return Check(name, "warn", f"cannot read the topic ID of {topic}: not checked")
    if recorded is None:
        return Check(
            name, "pass", f"{topic} {current}; none recorded for group {group} yet (a start does)"
        )
    if recorded != current:
        return Check(name, "fail", other_incarnation_line(topic, group, recorded, current))
    return Check(name, "pass", f"group {group}'s DB offsets belong to {topic} {current}")


def retention_check(config: dict[str, str], oldest_ms: dict[int, int], now_ms: int) -> Check:
    """The oldest unconsumed record is far from being deleted by retention."""
    name = "retention"
    retention = int(config.get("retention.ms", "-1"))
    if retention < 0:
        return Check(name, "pass", "retention.ms unlimited")
    human = f"retention.ms {retention} ({retention / _DAY_MS:.2f} days)"
    if not oldest_ms:
        return Check(name, "pass", f"{human}; nothing unconsumed")
    partition, stamp = min(oldest_ms.items(), key=lambda kv: kv[1])
    age = max(now_ms - stamp, 0)
    where = f"oldest unconsumed record (partition {partition}) is {age / 1000:.0f}s old"
    if age >= retention:
        return Check(name, "fail", f"{where}, past {human}: it may be deleted before ingest")
    if age >= retention / 2:
        return Check(name, "warn", f"{where}, over half of {human}")
    return Check(name, "pass", f"{where}; {human}")


def dlq_check(dlq_topic: str, exists: bool) -> Check:
    if exists:
        return Check("dead-letter topic", "pass", f"{dlq_topic} exists")
    return Check(
        "dead-letter topic", "warn", f"{dlq_topic} missing (the first `ackline run` makes it)"
    )


def dlq_durability_check(dlq: TopicFacts, source: TopicFacts) -> Check:
    """A dead letter must survive what an ingested event survives: the dead-letter topic's
    replication factor and min.insync.replicas are at least the source topic's."""
    name = "dead-letter durability"
    weaker = weaker_than_source(
        dlq.replication_factor,
        int(dlq.config.get("min.insync.replicas", "1")),
        source.replication_factor,
        int(source.config.get("min.insync.replicas", "1")),
        source.brokers,
    )
    if weaker:
        return Check(
            name, "warn", f"{dlq.topic} is weaker than {source.topic}: " + "; ".join(weaker)
        )
    return Check(name, "pass", f"{dlq.topic} is as durable as {source.topic}")


def exit_status(checks: Sequence[Check]) -> int:
    return 1 if any(c.status == "fail" for c in checks) else 0


def render(checks: Sequence[Check]) -> str:
    return table(("", "check", "detail"), [(c.status.upper(), c.name, c.detail) for c in checks])


def to_json(checks: Sequence[Check]) -> dict[str, Any]:
    return {"ok": exit_status(checks) == 0, "checks": [asdict(c) for c in checks]}


# ---- gathering (read-only I/O) --------------------------------------------------------------


@dataclass
class _DbFacts:
    applied: dict[int, str] | None
    roles: RolesReport | None
    has_tables: bool
    offsets: list[OffsetRow]
    groups: list[str]
    """The groups with offsets for the topic, read only when this group has none."""
    recorded_id: str | None = None
    """The topic ID the group's DB offsets belong to (migration 0015), if recorded."""
    has_incarnations: bool = False
    """Whether migration 0015's table is there."""


async def _db_facts(
    dsn: str, group: str, topic: str, files: list[Migration], timeout: float
) -> _DbFacts:
    conn = await asyncpg.connect(dsn, timeout=timeout)
    try:
        applied: dict[int, str] | None = None
        if await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
            rows = await conn.fetch("SELECT version, sha256 FROM schema_migrations")
            applied = {int(r["version"]): str(r["sha256"]) for r in rows}
        roles_file = grants_model(files, applied or {})
        roles = None
        if roles_file is not None:
            done = applied is not None and roles_file.version in applied
            roles = await check_roles(conn, roles_file, done, migration_tables(files))
        has_tables = await conn.fetchval(
            "SELECT to_regclass('activity') IS NOT NULL AND "
            "to_regclass('consumer_offsets') IS NOT NULL"
        )
        offsets = await db_offsets(conn, group, topic) if has_tables else []
        groups = await groups_with_offsets(conn, topic) if has_tables and not offsets else []
        migrated = await incarnation.migrated(conn)
        recorded = await incarnation.recorded_id(conn, group, topic) if migrated else None
        return _DbFacts(applied, roles, bool(has_tables), offsets, groups, recorded, migrated)
    finally:
        await conn.close()


def worker_check(settings: Settings, dsn: str) -> Check:
    """Connect as `ackline run` would (the ingest DSN) and ask what that role may do."""

    async def view(worker_dsn: str) -> tuple[str, list[str]]:
        conn = await asyncpg.connect(worker_dsn, timeout=settings.db_connect_timeout_s)
        try:
            return await may_modify_activity(conn)
        finally:
            await conn.close()

    try:
        user, held = run_stoppable(view(ingest_dsn(settings, dsn)))
    except AcklineError as exc:
        return Check("append-only", "fail", str(exc))
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return Check("append-only", "fail", f"the worker cannot connect: {exc}")
    return append_only_check(user, held)


def gather(settings: Settings, bootstrap: str, dsn: str) -> list[Check]:
    """Run every check against the services; a service that cannot be reached fails once."""
    conf = kafka_client_config(settings)
    topic, group = settings.topic, settings.group_id
    files = load_migrations()
    checks: list[Check] = []
    db: _DbFacts | None = None
    try:
        brokers = reachable(bootstrap, conf)
        checks.append(Check("kafka", "pass", f"{bootstrap}: {brokers} broker(s)"))
        kafka_ok = True
    except AcklineError as exc:
        checks.append(Check("kafka", "fail", str(exc)))
        kafka_ok = False
    try:
        db = run_stoppable(_db_facts(dsn, group, topic, files, settings.db_connect_timeout_s))
        checks.append(Check("postgresql", "pass", "reachable"))
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        hint = f": {dsn_hint()}" if isinstance(exc, (OSError, TimeoutError)) else ""
        checks.append(Check("postgresql", "fail", f"cannot query PostgreSQL: {exc}{hint}"))
    if db is not None:
        checks.append(migrations_check(files, db.applied))
        checks.append(roles_check(db.roles))
        if db.has_tables:
            checks.append(worker_check(settings, dsn))
    else:
        checks += [
            Check(n, "skip", "PostgreSQL unreachable") for n in ("migrations", "roles and grants")
        ]
    if not kafka_ok:
        return [*checks, Check("topic", "skip", "Kafka unreachable")]
    checks += _topic_checks(settings, bootstrap, conf, db)
    return checks


def _incarnation(settings: Settings, bootstrap: str, conf: dict[str, Any], db: _DbFacts) -> Check:
    current = None
    if db.has_incarnations:
        with contextlib.suppress(KafkaUnavailableError):
            current = topic_id(bootstrap, conf, settings.topic, 5.0)
    return incarnation_check(
        settings.topic, settings.group_id, current, db.recorded_id, db.has_incarnations
    )


def _topic_checks(
    settings: Settings, bootstrap: str, conf: dict[str, Any], db: _DbFacts | None
) -> list[Check]:
    topic = settings.topic
    facts = describe_topic(bootstrap, conf, topic)
    checks = [partitions_check(topic, facts)]
    if facts is not None:
        checks.append(replication_check(facts))
        logs = topic_offsets(bootstrap, conf, settings.group_id, topic) or []
        if db is None:
            checks.append(Check("offsets", "skip", "PostgreSQL unreachable"))
        elif not db.has_tables:  # no offsets to be inside the log: not a pass
            checks.append(Check("offsets", "skip", "the database is not migrated"))
        else:
            # lag as `ackline status` and the worker's gauge count it (ackline.streams.lag):
            # up to the last stable offset, ranges holding only transaction markers or
            # aborted records left out; the same read finds the oldest unconsumed record
            starts, ends = unread_starts(db.offsets, logs)
            oldest, settled = scan_ranges(bootstrap, conf, topic, starts, ends)
            rows = merge(db.offsets, logs, settled=settled)
            missing = (
                no_offsets_note(db.offsets, settings.group_id, topic, db.groups)
                if db.has_tables
                else None
            )
            checks.append(offsets_check(rows, facts.partitions, missing))
            checks.append(_incarnation(settings, bootstrap, conf, db))
            checks.append(retention_check(facts.config, oldest, int(time.time() * 1000)))
    dlq = describe_topic(bootstrap, conf, settings.dlq_topic)
    checks.append(dlq_check(settings.dlq_topic, dlq is not None))
    if dlq is not None and facts is not None:
        checks.append(dlq_durability_check(dlq, facts))
    return checks
