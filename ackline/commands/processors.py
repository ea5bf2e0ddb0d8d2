"""`ackline process` and `ackline processors`: stream processors (docs/processors.md).

``process NAME...`` runs processors (each its own cursor and connection) as the processor
role until SIGTERM/SIGINT, or with ``--until-caught-up`` until there is nothing left to
read (a stop before then is 128 + the signal, not 0: a cron job must not take it for the
work done). A batch still uncommitted ACKLINE_SHUTDOWN_WAIT_S after the stop is
cancelled (it rolls back), and at once at a second SIGINT, as in `ackline tail`.
``/metrics``, ``/healthz`` and ``/readyz`` on ``ACKLINE_METRICS_PORT`` like
``ackline run``. PostgreSQL unreachable at start is one error line and exit 2 at once;
lost later, it is retried for at most ACKLINE_RETRY_MAX_SECONDS with
``--until-caught-up``, else with one ERROR line once that long has passed, and on (as
`ackline tail` and `ackline dispatch` do). ``processors list|status|pause|resume|reset|
setup`` are the operator's and connect with the operator's DSN.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ackline.commands import Subparsers, nonempty, positive_seconds, uses, whole_from
from ackline.commands.feed import FOLLOWS_THE_FEED
from ackline.commands.guard import Outage
from ackline.core.errors import AcklineError
from ackline.core.signals import run_stoppable
from ackline.settings import Settings
from ackline.sinks.feed.types import MAX_BYTES as FEED_MAX_BYTES

if TYPE_CHECKING:
    import asyncpg

    from ackline.runtime.httpserver import HttpServer
    from ackline.sinks.feed.processors.contract import Processor
    from ackline.sinks.feed.processors.control import Status
    from ackline.sinks.feed.processors.metrics import ProcessorMetrics
    from ackline.sinks.feed.processors.runner import Report
    from ackline.sinks.feed.types import Cursor

log = logging.getLogger("ackline.process")


def _operator_dsn(settings: Settings) -> str:
    """PostgreSQL only: ACKLINE_DATABASE_URL (with the TLS settings), else the local stack."""
    if settings.database_url is not None:
        from ackline.clients import database_dsn

        return database_dsn(settings.database_url.get_secret_value(), settings)
    from ackline.endpoints import endpoints

    return endpoints(settings)[1]


# --- `ackline process` -------------------------------------------------------------------


def cmd_process(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.clients import processor_dsn, processor_setting
    from ackline.sinks.feed.processors.registry import load

    processors = [load(spec) for spec in args.names]
    names = [p.name for p in processors]
    if len(set(names)) != len(names):
        raise AcklineError(f"a processor is named twice: {names}")
    if args.batch_events < 1 or args.max_transactions < 1:
        raise AcklineError("--batch-events and --max-transactions must be at least 1")
    dsn = processor_dsn(settings, _operator_dsn(settings))
    # before the loop that takes the signals over: a stop here must not be raised into
    # asyncpg (core.signals.run_stoppable); PostgreSQL unreachable now is one line
    timeout = settings.db_connect_timeout_s
    run_stoppable(_reachable(dsn, processor_setting(settings), timeout))
    start = run_stoppable(_start_cursor(args, dsn, processors, timeout))
    return asyncio.run(_process(args, settings, dsn, processors, start))


async def _reachable(dsn: str, setting: str, timeout: float) -> None:
    """:class:`DatabaseUnavailableError` (the address and a fix) when PostgreSQL does not
    answer, and one line saying to run `ackline migrate` when the database lacks the
    feed's tables (naming ``setting``, the one ``dsn`` came from): checked once, before
    the runners, each of which retries what fails later and would take a missing table
    for its processor's failure (exit 1, no fix)."""
    from ackline.commands.guard import FEED_TABLES, connect, require_tables

    conn = await connect(dsn, timeout=timeout)
    try:
        await require_tables(conn, FEED_TABLES, setting)
    finally:
        await conn.close()


async def _start_cursor(
    args: argparse.Namespace, dsn: str, processors: list[Processor], timeout: float
) -> Cursor | None:
    """Where new processors start (None: the start of the feed). Given for processors
    that already have a cursor, it is an error: `processors reset` moves a cursor."""
    from ackline.commands.guard import connect
    from ackline.sinks.errors import FeedError
    from ackline.sinks.feed.changefeed import saved_cursor
    from ackline.sinks.feed.processors.control import head
    from ackline.sinks.feed.types import Cursor

    if not (args.from_cursor or args.from_now):
        return None
    conn = await connect(dsn, timeout=timeout)
    try:
        for p in processors:
            if await saved_cursor(conn, p.name) is not None:
                raise FeedError(
                    f"processor {p.name!r} already has a cursor; --from-cursor/--from-now set "
                    f"only a new one (`ackline processors reset {p.name} --to-...` moves it)"
                )
        return Cursor.decode(args.from_cursor) if args.from_cursor else await head(conn)
    finally:
        await conn.close()


async def _process(
    args: argparse.Namespace,
    settings: Settings,
    dsn: str,
    processors: list[Processor],
    start_at: Cursor | None,
) -> int:
    from ackline.clients import feed_bounds, processor_setting
    from ackline.commands.processor_run import run_processors
    from ackline.sinks.feed.changefeed import connector
    from ackline.sinks.feed.processors.metrics import ProcessorMetrics
    from ackline.sinks.feed.processors.runner import ProcessorRunner
    from ackline.sinks.feed.types import START

    instance = args.instance or settings.worker_id
    start = start_at or START
    metrics = ProcessorMetrics()
    faults = settings.fault_points()
    runners = [
        ProcessorRunner(
            p,
            instance=instance,
            metrics=metrics,
            faults=faults,
            max_transactions=args.max_transactions,
            batch_events=args.batch_events,
            batch_bytes=args.batch_bytes,
            poll_interval=args.poll_interval,
            start=start,
            idle_in_transaction_timeout_ms=settings.db_idle_in_transaction_timeout_ms,
        )
        for p in processors
    ]
    connect = connector(
        dsn,
        f"ackline-process:{instance}",
        feed_bounds(settings),
    )
    names = [r.name for r in runners]
    server = _endpoints(metrics, names)
    endpoint = server.serve(settings)

    def said(reports: list[Report], by: int | None) -> None:
        line = {
            "instance": instance,
            "processors": [r.to_json() for r in reports],
            "stopped": None if by is None else signal.Signals(by).name,
        }
        print(json.dumps(line), flush=True)

    try:
        return await run_processors(
            runners,
            connect,
            settings,
            wait=not args.until_caught_up,
            started=lambda: log.info(
                "processors %s following the feed as instance %s; metrics %s",
                ", ".join(names),
                instance,
                endpoint,
            ),
            summary=said,
            each=Outage(
                dsn,
                settings.retry_max_seconds,
                args.until_caught_up,
                log,
                setting=processor_setting(settings),
            ).wrap,
            # still under the signal handlers: a run that caught up prints its line and
            # exits 0 (the close waits up to 0.5 s)
            ended=server.close,
        )
    finally:
        server.close()


def _endpoints(metrics: ProcessorMetrics, names: list[str]) -> HttpServer:
    """``/metrics`` (the processors' registry), ``/healthz``, and ``/readyz``: ready while
    the last lag sample reached PostgreSQL and no processor is stopped at an event."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from ackline.runtime.httpserver import HttpServer, json_body, not_found

    def respond(path: str) -> tuple[int, str, bytes]:
        route = path.split("?", 1)[0]
        if route == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(metrics.registry)
        if route == "/healthz":
            return 200, "application/json", json_body({"status": "alive"})
        if route == "/readyz":
            reasons = []
            if _value(metrics, "ackline_processor_database_up") != 1:
                reasons.append("PostgreSQL not reached at the last lag sample")
            for name in names:
                if _value(metrics, "ackline_processor_failed", name) == 1:
                    reasons.append(f"processor {name} stopped (at an event, or superseded)")
            body = {"ready": not reasons, "reasons": reasons}
            return (503 if reasons else 200), "application/json", json_body(body)
        return not_found(route)

    return HttpServer(respond)


def _value(metrics: ProcessorMetrics, sample: str, processor: str | None = None) -> float | None:
    labels = {} if processor is None else {"processor": processor}
    found = metrics.registry.get_sample_value(sample, labels)
    return None if found is None else float(found)


# --- `ackline processors ...` --------------------------------------------------------------


async def _with_conn(settings: Settings, action: Callable[[asyncpg.Connection], Any]) -> Any:
    """``action`` as the operator, within ACKLINE_DB_CONNECT_TIMEOUT_S (unbounded, it
    waited asyncpg's 60 s and named no address)."""
    from ackline.commands.guard import on_database

    return await on_database(settings, action)


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.sinks.feed.processors.registry import available

    found = available()
    if args.json:
        print(json.dumps(found))
    else:
        for name, target in found.items():
            print(f"{name:<24} {target}")
    return 0


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.sinks.feed.processors.control import no_such_processor, statuses

    async def read(conn: asyncpg.Connection) -> list[Status]:
        found = await statuses(conn, args.names or None)
        missing = sorted(set(args.names or []) - {s.name for s in found})
        if missing:  # a typo: the known names beside it, no table of the others
            raise await no_such_processor(conn, missing)
        return found

    found = run_stoppable(_with_conn(settings, read))
    if args.json:
        print(json.dumps([s.to_json() for s in found]))
    else:
        now = time.time()
        print(
            f"{'processor':<20} {'state':<7} {'applied':>10} {'erased':>8} {'lag events':>11} "
            f"{'lag s':>8} {'last commit':>12}  cursor"
        )
        for s in found:
            ago = (
                "-"
                if s.last_commit_at is None
                else f"{now - s.last_commit_at.timestamp():.0f}s ago"
            )
            print(
                f"{s.name:<20} {s.state:<7} {s.applied:>10,} {s.erased:>8,} {s.lag_events:>11,} "
                f"{s.lag_seconds:>8.1f} {ago:>12}  {s.cursor or '-'}"
            )
            if s.filter is not None:
                since = "-" if s.filter_at is None else s.filter_at.isoformat(timespec="seconds")
                print(
                    f"  filter in effect {s.filter} (since {since}, "
                    f"instance {s.filter_instance or '-'})"
                )
            for old in s.superseded_filters:
                print(f"  replaced filter {old} (does not take over again)")
            if s.failed_at is not None:
                print(
                    f"  stopped at event {s.error_event_id or '-'} (after cursor "
                    f"{s.error_cursor or '-'}): {s.error}"
                )
    return 0


def cmd_pause(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.sinks.feed.processors.control import set_paused

    paused = args.action == "pause"
    run_stoppable(_with_conn(settings, lambda c: set_paused(c, args.name, paused)))
    print(f"processor {args.name} {'paused' if paused else 'resumed'}")
    return 0


def cmd_clear_superseded(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.sinks.feed.processors.control import clear_superseded

    run_stoppable(_with_conn(settings, lambda c: clear_superseded(c, args.name)))
    print(
        f"processor {args.name}: any filter may take over again (the next instance to start "
        "with another filter does)"
    )
    return 0


def cmd_reset(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.sinks.feed.processors.control import reset
    from ackline.sinks.feed.processors.registry import cursor_name, load
    from ackline.sinks.feed.types import START, Cursor

    if args.skip_events and not args.cursor_only:
        # without --cursor-only the state is cleared and the cursor rewound: there is
        # nothing to skip, and the flag was dropped with the state gone
        raise AcklineError(
            "--skip-events needs --cursor-only (it moves the cursor forward past unread "
            "events and keeps the state; without --cursor-only the state is cleared)"
        )
    clear = None
    if not args.cursor_only:
        processor = load(args.name)
        clear = getattr(processor, "reset", None)
        if clear is None:
            raise AcklineError(
                f"processor {args.name!r} has no reset(): it cannot forget its effects. "
                "--cursor-only moves the cursor and keeps them (back: the events after it "
                "are applied again; forward past unread ones: refused without --skip-events)"
            )
        name = processor.name
    else:
        name = cursor_name(args.name)
    to: Cursor | None = START
    if args.to_cursor:
        to = Cursor.decode(args.to_cursor)
    elif args.to_now:
        to = None
    faults = settings.fault_points()
    moved = run_stoppable(
        _with_conn(
            settings,
            lambda c: reset(c, name, to, clear, args.accept_gap, faults, args.skip_events),
        )
    )
    kept = " (its state kept)" if args.cursor_only else " and its state cleared"
    print(f"processor {name} reset to cursor {moved.encode()}{kept}")
    return 0


_MAY_BE_MIGRATOR = "SELECT pg_has_role(current_user, 'ackline_migrator', 'MEMBER')"


def cmd_setup(args: argparse.Namespace, settings: Settings) -> int:
    """Run a processor's ``setup_sql`` as the operator, owned by ackline_migrator."""
    from ackline.sinks.feed.processors.registry import load

    processor = load(args.name)
    sql = getattr(processor, "setup_sql", None)
    if not sql:
        print(f"processor {processor.name} has no setup_sql: nothing to do")
        return 0
    if not isinstance(sql, str):
        raise AcklineError(f"processor {processor.name}: setup_sql must be SQL text")

    async def go(conn: asyncpg.Connection) -> None:
        async with conn.transaction():
            if await conn.fetchval(_MAY_BE_MIGRATOR):
                await conn.execute("SET LOCAL ROLE ackline_migrator")
            await conn.execute(sql)

    run_stoppable(_with_conn(settings, go))
    print(f"processor {processor.name}: setup_sql applied")
    return 0


def register(sub: Subparsers) -> None:
    proc = sub.add_parser(
        "process",
        help="run stream processors: exactly-once effects in PostgreSQL per ingested event",
    )
    proc.add_argument(
        "names",
        nargs="+",
        type=nonempty,
        metavar="NAME",
        help="a built-in (runs, dispatcher), an entry point of ackline.processors, "
        "or module:attribute",
    )
    proc.add_argument("--until-caught-up", action="store_true", help="stop once caught up")
    proc.add_argument(
        "--instance", type=nonempty, help="this instance's name (default ACKLINE_WORKER_ID)"
    )
    start = proc.add_mutually_exclusive_group()
    start.add_argument(
        "--from-cursor", type=nonempty, help="a NEW processor starts after this cursor"
    )
    start.add_argument(
        "--from-now", action="store_true", help="a NEW processor skips what is in the feed now"
    )
    proc.add_argument(
        "--batch-events", type=whole_from(1), default=5_000, help="events per transaction"
    )
    proc.add_argument(
        "--batch-bytes",
        type=whole_from(1),
        default=FEED_MAX_BYTES,
        help="payload bytes per transaction (JSON text; a batch also ends after the event "
        "that passes them, and its first event is read however large)",
    )
    proc.add_argument(
        "--max-transactions",
        type=whole_from(1),
        default=16,
        help="ingest transactions per feed read",
    )
    proc.add_argument(
        "--poll-interval", type=positive_seconds, default=2.0, help="fallback poll, seconds"
    )
    proc.set_defaults(handler=cmd_process)
    uses(proc, why=FOLLOWS_THE_FEED)

    p = sub.add_parser("processors", help="stream processors: list, status, pause, resume, reset")
    actions = p.add_subparsers(dest="action", required=True)
    lst = actions.add_parser("list", help="processors findable by name")
    lst.add_argument("--json", action="store_true", help="print one JSON object")
    lst.set_defaults(handler=cmd_list)
    st = actions.add_parser(
        "status", help="cursor, lag, pause, failure and filter in effect of each processor"
    )
    st.add_argument(
        "names", nargs="*", type=nonempty, metavar="NAME", help="processors to show (default: all)"
    )
    st.add_argument("--json", action="store_true", help="print one JSON object")
    st.set_defaults(handler=cmd_status)
    pauses = []
    for action, text in (
        ("pause", "stop applying at the next batch boundary"),
        ("resume", "undo pause"),
    ):
        a = actions.add_parser(action, help=text)
        a.add_argument("name", type=nonempty, help="processor name")
        a.set_defaults(handler=cmd_pause)
        pauses.append(a)
    cs = actions.add_parser(
        "clear-superseded",
        help="let a filter replaced before take over again (a deliberate rollback)",
    )
    cs.add_argument("name", type=nonempty, help="processor name")
    cs.set_defaults(handler=cmd_clear_superseded)
    rs = actions.add_parser(
        "reset", help="rebuild: clear a processor's state and rewind its cursor (one transaction)"
    )
    rs.add_argument("name", type=nonempty, help="processor name, entry point or module:attribute")
    to = rs.add_mutually_exclusive_group()
    to.add_argument(
        "--to-cursor", type=nonempty, help="rewind to after this cursor (default: the start)"
    )
    to.add_argument("--to-now", action="store_true", help="move to the feed head now")
    rs.add_argument(
        "--cursor-only", action="store_true", help="move the cursor only; keep the state"
    )
    rs.add_argument(
        "--accept-gap",
        action="store_true",
        help="rebuild although retention dropped events after the target (they are lost to it)",
    )
    rs.add_argument(
        "--skip-events",
        action="store_true",
        help="only with --cursor-only (refused without it): move forward past events it has "
        "not applied (never applied)",
    )
    rs.set_defaults(handler=cmd_reset)
    su = actions.add_parser("setup", help="run a processor's setup_sql (its tables, grants)")
    su.add_argument("name", type=nonempty, help="processor name, entry point or module:attribute")
    su.set_defaults(handler=cmd_setup)
    for each in (lst, st, *pauses, cs, rs, su):
        uses(each, why="processors follow the changefeed: every topic and group ingested")
