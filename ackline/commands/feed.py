"""`ackline tail` and `ackline dispatch`: readers of the changefeed (sinks/feed).

`ackline dispatch` is the dispatcher processor under its older name (docs/processors.md).
Both stop on SIGTERM or SIGINT: the batch in hand commits (or rolls back), then the
command returns; a read or commit that does not end within ACKLINE_SHUTDOWN_WAIT_S is
cancelled (its transaction rolls back: nothing is lost, the batch is read again next
time), and at once at a second SIGINT (core.signals.Stopping). Run to catch up (`tail`
without ``--follow``, `dispatch --once`), a stop before it had is 128 + the signal, not
0: a script must not take it for the work done.
PostgreSQL unreachable at the first connect is one error line at once; lost later, it
is retried — for at most ACKLINE_RETRY_MAX_SECONDS when the command would end by itself,
else with one ERROR line once that long has passed, and on until it answers or the
command is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ackline.commands import Subparsers, nonempty, positive_seconds, uses, whole_from
from ackline.commands.guard import FEED_TABLES, guarded_connect, require_tables
from ackline.core.signals import bounded_stop, run_stoppable, stopped_status, work_done
from ackline.settings import Settings
from ackline.sinks.feed.types import MAX_BYTES as FEED_MAX_BYTES

if TYPE_CHECKING:
    import asyncpg

    from ackline.sinks.feed.types import Cursor

log = logging.getLogger("ackline.feed")
Connect = Callable[[], Awaitable["asyncpg.Connection"]]
FOLLOWS_THE_FEED = "it follows the changefeed: every topic and group ingested"
"""Why the changefeed's readers (tail, dispatch, process) refuse --topic and --group-id."""


def _dsn(settings: Settings) -> str:
    """PostgreSQL only: ACKLINE_DATABASE_URL (with the TLS settings), else the local stack."""
    from ackline.endpoints import database

    return database(settings)


class _StdoutClosed(Exception):
    """stdout's reader went away: stop tailing, quietly."""


def cmd_tail(args: argparse.Namespace, settings: Settings) -> int:
    return run_stoppable(_tail(args, settings, _dsn(settings)))


async def _tail(args: argparse.Namespace, settings: Settings, dsn: str) -> int:
    import asyncpg

    from ackline.clients import feed_bounds
    from ackline.sinks.errors import FeedError
    from ackline.sinks.feed.changefeed import (
        AnyReader,
        Changefeed,
        LocalReader,
        Reader,
        connector,
        follow,
    )
    from ackline.sinks.feed.processors.control import refused_by_guard
    from ackline.sinks.feed.types import START, Cursor, FeedBatch, Filter, event_line

    if args.limit is not None and args.limit < 1:
        raise FeedError("--limit must be at least 1")
    if args.batch_events < 1:
        raise FeedError("--batch-events must be at least 1")
    if args.commit and not args.reader:
        raise FeedError("--commit needs --reader NAME")
    feed = Changefeed(Filter.of(args.types, args.agents), max_bytes=args.batch_bytes)
    connect = guarded_connect(
        dsn,
        connector(
            dsn,
            f"ackline-tail:{args.reader or '-'}",
            feed_bounds(settings),
        ),
        settings.retry_max_seconds,
        give_up=not args.follow,
        log=log,
    )
    reader: AnyReader
    if args.commit:
        reader = Reader(args.reader, feed)
    else:
        start = START
        if args.from_cursor:
            start = Cursor.decode(args.from_cursor)
        elif args.reader:
            start = await _saved_cursor(connect, args.reader, create=args.follow)
        reader = LocalReader(feed, start=start)

    async def handle(conn: asyncpg.Connection, batch: FeedBatch) -> None:
        # Inside the reader's transaction: with --commit the cursor commits after the
        # lines are flushed, so a crash in between prints them again (at least once).
        try:
            for event in batch.events:
                sys.stdout.write(event_line(event) + "\n")
            sys.stdout.flush()
        except BrokenPipeError as exc:  # the reader of our stdout left: not an error
            raise _StdoutClosed() from exc

    stop = asyncio.Event()
    ended: list[bool] = []  # follow() ended by itself: caught up, or --limit reached
    with bounded_stop(stop, settings.shutdown_wait_s) as stopping:
        try:
            cursor = await stopping.run(
                follow(
                    reader,
                    connect,
                    handle,
                    stop,
                    wait=args.follow,
                    poll_interval=args.poll_interval,
                    limit=args.limit,
                    batch_events=args.batch_events,
                    # only --commit prints inside a transaction (LocalReader autocommits)
                    idle_in_transaction_s=(
                        settings.db_idle_in_transaction_timeout_ms / 1000 if args.commit else None
                    ),
                    on_end=lambda: ended.append(True),
                )
            )
        except _StdoutClosed:
            # the reader of our stdout left (`| head`); with --commit the batch rolled back
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return work_done(0)
        except asyncpg.PostgresError as exc:
            if not refused_by_guard(exc):
                raise
            # --commit on a processor's cursor: 0012's guard refused it, the batch rolled
            # back (a traceback said so, in an operator's hunt); the database's words
            raise FeedError(f"reader {args.reader}: {exc}") from exc
        # still under the handlers: a stop from here on does not cut the last line
        said = (
            "stopped (a read was cancelled; nothing committed)"
            if cursor is None
            else f"cursor {cursor.encode()}"
        )
        print(f"ackline tail: {said}", file=sys.stderr)
        cut = stopping.signal is not None and not ended and not args.follow
        return work_done(stopped_status(stopping.signal) if cut and stopping.signal else 0)


async def _saved_cursor(connect: Connect, reader: str, create: bool) -> Cursor:
    """The reader's saved cursor. A reader seen for the first time is an error, unless
    ``create`` (``--follow``): then its cursor row is made at the start of the feed, as
    a first `--commit` run would make it, and tail shows what that reader will consume."""
    from ackline.sinks.errors import FeedError
    from ackline.sinks.feed.changefeed import Reader, saved_cursor

    conn = await connect()
    try:
        cursor = await saved_cursor(conn, reader)
        if cursor is None and create:
            log.info("reader %s is new: created at the start of the feed", reader)
            return await Reader(reader).position(conn)
    finally:
        await conn.close()
    if cursor is None:
        raise FeedError(
            f"no reader named {reader!r} yet (feed_cursors has no row for it): create it "
            f"with `ackline tail --reader {reader} --follow` (or --commit)"
        )
    return cursor


def cmd_dispatch(args: argparse.Namespace, settings: Settings) -> int:
    return run_stoppable(_dispatch(args, settings, _dsn(settings)))


def _refuse_a_processors_cursor(reader: str) -> None:
    """``--reader`` must not name another processor: the dispatcher would take over its
    cursor (the newest instance of a name does) and move it past events that processor
    never applied, and the processor was then superseded (an operator's hunt: `dispatch
    --reader runs` left the projection short, then stalled)."""
    from ackline.sinks.errors import FeedError
    from ackline.sinks.feed.processors.registry import BUILTINS, available

    target = available().get(reader)
    if target is not None and target != BUILTINS["dispatcher"]:
        raise FeedError(
            f"--reader {reader} is the cursor of processor {reader} ({target}): dispatching "
            "on it would move it past events that processor never applied; name the "
            "dispatcher's own cursor (default: dispatcher)"
        )


async def _refuse_a_registered_processors_cursor(
    conn: asyncpg.Connection, reader: str, dispatchers: str
) -> None:
    """The database's view of :func:`_refuse_a_processors_cursor`: a processor registered
    under ``reader`` whose filter in effect is not the dispatcher's (``dispatchers``, a
    fingerprint) is another processor, installed here or not (the entry points know only
    what is installed where dispatch runs). A dispatcher's own cursor, and a reader no
    processor registered, pass. Read-only."""
    from ackline.sinks.errors import FeedError
    from ackline.sinks.feed.processors.control import filter_in_effect

    in_effect = await filter_in_effect(conn, reader)
    if in_effect.filter is not None and in_effect.filter != dispatchers:
        raise FeedError(
            f"--reader {reader} is the cursor of processor {reader}, whose filter in "
            f"effect ({in_effect.filter}) is not the dispatcher's: dispatching on it would "
            "move it past events that processor never applied; name the dispatcher's own "
            "cursor (default: dispatcher)"
        )


async def _dispatch(args: argparse.Namespace, settings: Settings, dsn: str) -> int:
    """The dispatcher processor (`ackline process dispatcher`), under its older name.

    Kept for compatibility: it connects with the operator's DSN as it always did, names
    its cursor ``--reader`` and prints the same summary line. It runs as `process` does
    (:func:`run_processors`): the lag watch and its heartbeat, and the progress lines.
    """
    import json

    from ackline.clients import feed_bounds
    from ackline.commands.processor_run import run_processors
    from ackline.sinks.feed.changefeed import connector
    from ackline.sinks.feed.dispatcher import Dispatcher
    from ackline.sinks.feed.processors.contract import check
    from ackline.sinks.feed.processors.runner import Outcome, ProcessorRunner, Report

    instance = args.instance or settings.worker_id
    _refuse_a_processors_cursor(args.reader)
    dispatcher = Dispatcher(args.reader)
    runner = ProcessorRunner(
        check(dispatcher, f"dispatcher {args.reader!r}"),
        instance=instance,
        faults=settings.fault_points(),
        max_transactions=args.max_transactions,
        poll_interval=args.poll_interval,
        idle_in_transaction_timeout_ms=settings.db_idle_in_transaction_timeout_ms,
    )
    opened = connector(
        dsn,
        f"ackline-dispatch:{instance}",
        feed_bounds(settings),
    )
    connect = guarded_connect(dsn, opened, settings.retry_max_seconds, give_up=args.once, log=log)
    # PostgreSQL unreachable, or never migrated, now is one error line and exit 2, as for
    # tail and process: the runner would take either for the processor's failure (summary,
    # exit 1, no fix)
    first = await connect()
    try:
        await require_tables(first, FEED_TABLES)
        await _refuse_a_registered_processors_cursor(first, args.reader, runner.filter)
    finally:
        await first.close()
    dlog = logging.getLogger("ackline.dispatch")

    def said(reports: list[Report], by: int | None) -> None:
        (report,) = reports
        if report.outcome is Outcome.CANCELLED:
            dlog.warning("stopped with a feed transaction cancelled (rolled back: read again)")
        if report.outcome is Outcome.PAUSED:  # exit 0 as `process`: say so where cron sees it
            dlog.warning(
                "reader %s is paused, after %d transaction(s) read (`ackline processors "
                "resume %s`): what follows waits",
                args.reader,
                runner.reader.stats.transactions,
                args.reader,
            )
        summary = {
            "outcome": report.outcome.value,
            "reader": args.reader,
            "instance": instance,
            "started": dispatcher.started,
            "already_started": dispatcher.already_started,
            "transactions": runner.reader.stats.transactions,
            "lost_races": report.lost_races,
            "cursor": report.cursor,
            "stopped": None if by is None else signal.Signals(by).name,
        }
        print(json.dumps(summary), flush=True)

    # the lag watch retries on its own connections (as `process`'s): only the runner's
    # reconnects are bounded by ACKLINE_RETRY_MAX_SECONDS
    return await run_processors(
        [runner],
        connect,
        settings,
        wait=not args.once,
        # logged once SIGTERM is handled: from here a stop request prints the summary
        started=lambda: dlog.info(
            "dispatcher %s following the feed as reader %s", instance, args.reader
        ),
        summary=said,
        watch_connect=opened,
    )


def register(sub: Subparsers) -> None:
    tail = sub.add_parser(
        "tail", help="print ingested events in changefeed order, one JSON object a line"
    )
    src = tail.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--reader",
        type=nonempty,
        help="start at this reader's saved cursor (with --follow or --commit, a new reader "
        "is created at the start of the feed)",
    )
    src.add_argument(
        "--from-cursor", type=nonempty, help="start after this cursor (a line's 'cursor')"
    )
    src.add_argument("--from-start", action="store_true", help="start at the first batch")
    tail.add_argument(
        "--commit",
        action="store_true",
        help="with --reader: advance its saved cursor after each printed batch "
        "(stdout is outside the database: a crash can print a batch twice)",
    )
    tail.add_argument("--type", action="append", dest="types", help="event type (repeatable)")
    tail.add_argument("--agent", action="append", dest="agents", help="agent_id (repeatable)")
    tail.add_argument("--follow", action="store_true", help="keep waiting for new batches")
    tail.add_argument("--limit", type=whole_from(1), help="stop after N events")
    tail.add_argument(
        "--batch-events",
        type=whole_from(1),
        default=5_000,
        help="events per read (bounds memory: one feed transaction, such as a large "
        "erasure, can hold millions; a read cut inside it resumes there)",
    )
    tail.add_argument(
        "--batch-bytes",
        type=whole_from(1),
        default=FEED_MAX_BYTES,
        help="payload bytes per read (JSON text; a read also ends after the event that "
        "passes them, and the first event is read however large)",
    )
    tail.add_argument(
        "--poll-interval", type=positive_seconds, default=2.0, help="fallback poll, seconds"
    )
    tail.set_defaults(handler=cmd_tail)
    uses(tail, why=FOLLOWS_THE_FEED)

    disp = sub.add_parser(
        "dispatch",
        help="start one agent run per agent.requested event "
        "(the dispatcher processor; same as `ackline process dispatcher`)",
    )
    disp.add_argument(
        "--reader", type=nonempty, default="dispatcher", help="cursor name, shared by instances"
    )
    disp.add_argument(
        "--instance", type=nonempty, help="this instance's name (default ACKLINE_WORKER_ID)"
    )
    disp.add_argument("--once", action="store_true", help="exit once caught up")
    disp.add_argument(
        "--poll-interval", type=positive_seconds, default=2.0, help="fallback poll, seconds"
    )
    disp.add_argument(
        "--max-transactions", type=whole_from(1), default=64, help="feed transactions per batch"
    )
    disp.set_defaults(handler=cmd_dispatch)
    uses(disp, why=FOLLOWS_THE_FEED)
