"""Core commands: migrate, run, produce, verify, schema, demo."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ackline import endpoints
from ackline.commands import Subparsers, uses, whole_from
from ackline.commands.guard import connect
from ackline.core.signals import run_stoppable
from ackline.settings import Settings, poll_interval_advice

if TYPE_CHECKING:
    import asyncpg

    from ackline.sinks.connection import Database
    from ackline.sinks.ingest.incarnation import Confirmed

log = logging.getLogger(__name__)

_PREFLIGHT_SAY_S = 30.0
"""How often `run` says again that it waits for PostgreSQL before joining the group."""


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    """PostgreSQL only: migrating never waits on (or even looks for) Kafka."""
    from ackline.sinks.admin.migrate import migrate

    dsn = endpoints.database(settings)

    async def go() -> list[int]:
        conn = await connect(dsn, timeout=settings.db_connect_timeout_s)
        try:
            return await migrate(conn)
        finally:
            await conn.close()

    applied = run_stoppable(go())
    print(f"applied migrations {applied}" if applied else "schema is up to date")
    return 0


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.runtime import run

    if args.runtime is not None:  # the start-up line and /metrics name the runtime in use
        settings = settings.model_copy(update={"runtime": args.runtime})
    bootstrap, dsn = endpoints.endpoints(settings)
    advice = poll_interval_advice(settings)
    if advice is not None:
        log.warning("%s", advice)
    return run(
        settings,
        bootstrap,
        dsn,
        runtime=args.runtime,
        until_drained=args.until_drained,
        before_join=functools.partial(_preflight, settings, bootstrap, dsn),
    )


async def _preflight(
    settings: Settings, bootstrap: str, dsn: str, stopped: Callable[[], bool]
) -> Confirmed | None:
    """What the worker does after its topic checks and before it joins the group: wait
    until PostgreSQL answers, then its schema must be there (else one line: run `ackline
    migrate`), then the group's DB offsets for the topic must belong to the topic's
    incarnation in Kafka (else one line naming both topic IDs and `ackline offsets
    adopt-topic`: :func:`_same_incarnation`), then no live member of the group may carry
    its worker id (else one line naming ACKLINE_WORKER_ID:
    :func:`ackline.runtime.twins.refuse_a_namesake`). Returns early, having waited for
    nothing more, once ``stopped()``. Returns the topic ID the incarnation check
    confirmed, if it did: the running watch's baseline.

    Why wait before joining: a worker that joined the group while PostgreSQL did not
    answer held its partitions, idle, until its leave bound (90 s) handed them to workers
    that could write; one that has not joined holds nothing. The wait is the worker's own
    retry loop (:meth:`~ackline.sinks.connection.Database.retrying`, on one connection
    like the worker's): it waits out what that loop takes for transient — a connection
    refused, timed out (``ACKLINE_DB_CONNECT_TIMEOUT_S``), refused for too many clients,
    or lost during the schema check (bounded by ``ACKLINE_DB_STATEMENT_TIMEOUT_S``) — and
    it is quiet but for a WARNING at once and every :data:`_PREFLIGHT_SAY_S` seconds, an
    ERROR once the wait passes ``ACKLINE_DB_DOWN_ERROR_AFTER_S`` (as the settings say of
    every outage of the worker's: the WARNINGs alone went on for ever). A
    stop ends it within the loop's 0.1 s look at ``stopped()`` (the worker then exits 0:
    nothing was taken). The check's connection is dropped: nothing to wait for."""
    import asyncpg

    from ackline.clients import ingest_dsn, ingest_setting
    from ackline.commands.guard import DatabaseUnavailableError, migrate_hint, missing_role
    from ackline.core.errors import AcklineError
    from ackline.sinks.connection import Database
    from ackline.sinks.errors import WaitStoppedError

    target = ingest_dsn(settings, dsn)
    setting = ingest_setting(settings)
    database = Database(
        target,
        connect_timeout=settings.db_connect_timeout_s,
        statement_timeout=settings.db_statement_timeout_s,
        application_name=f"ackline-wait:{settings.worker_id}"[:63],
    )
    since = time.monotonic()
    say_at = since
    error_at = since + settings.db_down_error_after_s  # the first ERROR line, at once

    def waiting(exc: BaseException) -> None:
        nonlocal say_at, error_at
        now = time.monotonic()
        if now < say_at and now < error_at:
            return
        level = logging.WARNING
        if now >= error_at:  # as the worker's own outages: ERROR past the bound
            level, error_at = logging.ERROR, float("inf")
        waited = f" (waited {now - since:.0f} s)" if now - since >= 1 else ""
        log.log(
            level,
            "%s; not joining the consumer group until it answers%s",
            DatabaseUnavailableError(target, exc.__cause__ or exc, setting=setting),
            waited,
        )
        say_at = now + _PREFLIGHT_SAY_S

    try:
        missing, new_group = await database.retrying(
            "the wait for PostgreSQL before joining",
            lambda conn: _first_look(conn, settings.group_id, settings.topic),
            on_retry=waiting,
            stopping=stopped,
            quiet=True,
        )
        if say_at > since:
            log.info(
                "PostgreSQL answers after %.0f s: joining the consumer group",
                time.monotonic() - since,
            )
        if missing:
            raise AcklineError(
                f"the database at {_address(target)} has no ackline schema (no "
                f"consumer_offsets table): {migrate_hint(setting)}"
            )
        if new_group is not None:
            log.warning(
                "%s: this group reads the topic from its start, and dead-letters its poison "
                "records again",
                new_group,
            )
        confirmed = (
            None if stopped() else await _same_incarnation(settings, bootstrap, database, stopped)
        )
    except WaitStoppedError:
        return None
    except asyncpg.InvalidAuthorizationSpecificationError as exc:
        if "does not exist" in str(exc):
            raise AcklineError(missing_role(str(exc), setting)) from exc
        raise
    finally:
        await database.discard()
    if not stopped():
        from ackline.runtime.twins import refuse_a_namesake

        await refuse_a_namesake(settings, bootstrap, stopped)
    return confirmed


async def _first_look(conn: asyncpg.Connection, group: str, topic: str) -> tuple[bool, str | None]:
    """(the schema missing, the line when ``group`` has no DB offset for ``topic`` while
    other groups have some): a mistyped ACKLINE_GROUP_ID otherwise re-read the whole
    topic in silence (`status` and `doctor` said so; `run`, which does the reading, did
    not). A topic no group has ingested yet is no news."""
    from ackline.status import db_offsets, groups_with_offsets, no_offsets_note

    if await conn.fetchval("SELECT to_regclass('consumer_offsets') IS NULL"):
        return True, None
    if await db_offsets(conn, group, topic):
        return False, None
    others = await groups_with_offsets(conn, topic)
    return False, no_offsets_note([], group, topic, others) if others else None


async def _same_incarnation(
    settings: Settings, bootstrap: str, database: Database, stopped: Callable[[], bool]
) -> Confirmed | None:
    """Refuse to start (AcklineError, one line) when the group's DB offsets for the topic
    belong to another incarnation of it (deleted and made again under its name: its
    records below those offsets would never be ingested); record the topic's ID where
    none is (:mod:`ackline.sinks.ingest.incarnation`). Returns the ID so confirmed, the
    running watch's baseline (:class:`~ackline.runtime.incarnation_watch.IncarnationWatch`).

    Order of effects: read the topic's ID from Kafka (DescribeTopics), then one
    autocommitted call that records it unless one is recorded, and reads what is. A
    crash before that call leaves nothing; after it, the ID recorded is this
    incarnation's (or the one that was). A topic ID that cannot be read (describe not
    allowed, a broker that keeps none) or a schema before migration 0015 is a WARNING,
    and the worker starts as it did before the check (None: the watch checks its own
    first read)."""
    import asyncpg

    from ackline.clients import kafka_client_config
    from ackline.core.errors import AcklineError
    from ackline.sinks.ingest import incarnation
    from ackline.streams.errors import KafkaUnavailableError
    from ackline.streams.kafkainfo import topic_id

    topic, group = settings.topic, settings.group_id
    unchecked = "not checked that the group's DB offsets belong to this incarnation of it"
    read_at = time.monotonic()
    try:
        current = await asyncio.to_thread(
            topic_id, bootstrap, kafka_client_config(settings), topic, 5.0
        )
    except KafkaUnavailableError as exc:
        log.warning("cannot read the topic ID of %s (%s): %s", topic, exc, unchecked)
        return None
    if current is None:
        log.warning("Kafka gives no topic ID for %s: %s", topic, unchecked)
        return None
    try:
        found = await database.retrying(
            "the topic's incarnation check",
            lambda conn: incarnation.record(conn, group, topic, current),
            stopping=stopped,
        )
    except asyncpg.UndefinedFunctionError:
        log.warning(
            "the database has no topic incarnations (migration 0015: run `ackline migrate`): %s %s",
            topic,
            unchecked,
        )
        return None
    judged = incarnation.judge(topic, group, current, found)
    if judged.refusal is not None:
        raise AcklineError(judged.refusal)
    if judged.note is not None:
        log.info("%s", judged.note)
    return incarnation.Confirmed(current, read_at)


def _address(dsn: str) -> str:
    from ackline.settings import dsn_address

    return dsn_address(dsn)


def cmd_produce(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.clients import kafka_client_config
    from ackline.load.paths import check_target
    from ackline.load.produce import Knobs, produce

    manifest = Path(args.manifest)
    check_target(
        manifest, what="--manifest", overwrite=args.force, force_hint="pass --force to replace it"
    )
    bootstrap = endpoints.kafka(settings)
    knobs = Knobs(
        redeliver=args.redeliver,
        retry=args.retry,
        conflict_ledger=args.conflict_ledger,
        conflict_pk=args.conflict_pk,
        poison=args.poison,
        abort=args.abort,
    )
    produce(
        bootstrap,
        settings.topic,
        partitions=args.partitions,
        events=args.events,
        knobs=knobs,
        seed=args.seed,
        manifest_path=manifest,
        progress=not args.quiet,
        client_conf=kafka_client_config(settings),
        overwrite=args.force,
    )
    return 0


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.load.verify import print_summary, verify

    dsn = endpoints.database(settings)
    verdict = run_stoppable(
        verify(dsn, Path(args.manifest), settings.group_id, settings.db_connect_timeout_s)
    )
    if args.json:
        print(json.dumps(verdict.to_json()))
    else:
        print_summary(verdict)
    return 0 if verdict.ok else 1


def cmd_schema(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.schemas.jsonschema import envelope_json_schema

    text = json.dumps(envelope_json_schema(), indent=2, sort_keys=True) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8")
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.demo import demo

    return demo(settings, events=args.events, keep=args.keep)


def register(sub: Subparsers) -> None:
    mig = sub.add_parser(
        "migrate", help="apply pending SQL migrations (PostgreSQL only; Kafka is not needed)"
    )
    mig.set_defaults(handler=cmd_migrate)
    uses(mig, why="the schema serves every topic and group")

    run = sub.add_parser("run", help="consume the topic into PostgreSQL until SIGTERM")
    run.add_argument(
        "--until-drained",
        action="store_true",
        help="stop once this worker owns every partition of the topic and has read each "
        "to its end and written it (tests, demos; it never stops while another worker of "
        "the group holds a partition)",
    )
    run.add_argument(
        "--runtime",
        choices=("confluent", "faust"),
        help="consumer runtime (else ACKLINE_RUNTIME, default confluent); "
        "faust needs the [faust] extra, docs/faust.md",
    )
    run.set_defaults(handler=cmd_run)
    uses(run, "topic", "group_id")

    prod = sub.add_parser(
        "produce",
        help="generate realistic agent activity with faults, and its ground-truth manifest",
        description="Sends --events originals (plus the faults below, each a fraction of "
        "the events) to the topic (--topic / ACKLINE_TOPIC) in Kafka transactions and "
        "writes the manifest `ackline verify` checks the database against.",
    )
    prod.add_argument(
        "--events", type=whole_from(0), default=100_000, help="original events to send"
    )
    prod.add_argument(
        "--partitions", type=whole_from(1), default=12, help="partitions when the topic is created"
    )
    prod.add_argument(
        "--seed", type=int, default=1, help="the generator's seed (same seed, same plan)"
    )
    prod.add_argument(
        "--manifest",
        default=".ackline/manifest.jsonl.gz",
        help="where to write the manifest (gzip when it ends with .gz); must not exist "
        "unless --force",
    )
    prod.add_argument(
        "--force", action="store_true", help="replace an existing manifest at --manifest"
    )
    prod.add_argument(
        "--redeliver", type=float, default=0.03, help="fraction re-sent with the same bytes"
    )
    prod.add_argument(
        "--retry",
        type=float,
        default=0.02,
        help="fraction re-sent as a producer retry (same txn_id and body, new event_id)",
    )
    prod.add_argument(
        "--conflict-ledger",
        type=float,
        default=0.002,
        help="fraction replayed with the same txn_id and a changed body (a ledger conflict)",
    )
    prod.add_argument(
        "--conflict-pk",
        type=float,
        default=0.002,
        help="fraction replayed with the same event_id and a changed body (a key conflict)",
    )
    prod.add_argument(
        "--poison", type=float, default=0.002, help="fraction of undecodable or invalid records"
    )
    prod.add_argument(
        "--abort",
        type=float,
        default=0.02,
        help="fraction of transactions aborted (then re-sent and committed)",
    )
    prod.add_argument("--quiet", action="store_true", help="no progress bar")
    prod.set_defaults(handler=cmd_produce)
    uses(prod, "topic", why="it joins no consumer group")

    ver = sub.add_parser("verify", help="compare a produce manifest with the database")
    ver.add_argument(
        "--manifest",
        default=".ackline/manifest.jsonl.gz",
        help="the manifest `ackline produce` wrote; the verdict covers its records only",
    )
    ver.add_argument("--json", action="store_true", help="print one JSON object")
    ver.set_defaults(handler=cmd_verify)
    uses(ver, "group_id", why="the manifest names the topic")

    sch = sub.add_parser("schema", help="export the event JSON Schema")
    sch.add_argument(
        "output", nargs="?", default="-", help="file to write (default -: standard output)"
    )
    sch.set_defaults(handler=cmd_schema)
    uses(sch, why="it only writes the event JSON Schema")

    demo = sub.add_parser("demo", help="end to end: stack, migrate, produce, run, verify")
    demo.add_argument(
        "--events", type=whole_from(1), default=100_000, help="original events to produce"
    )
    demo.add_argument("--keep", action="store_true", help="leave the stack running")
    demo.set_defaults(handler=cmd_demo)
    # the demo verifies its own run only: a fresh topic and group each time
    uses(
        demo,
        why="each run produces into a new topic and consumes with a new group, "
        "demo-YYYYMMDD-HHMMSS, so that its verify counts only that run's events; to use "
        "your own topic and group, run `ackline produce`, `ackline run --until-drained` "
        "and `ackline verify`",
    )
