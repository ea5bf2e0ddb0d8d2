"""`ackline tail` and `ackline dispatch`: readers of the changefeed (sinks/feed).

`ackline dispatch` is the dispatcher processor under its older name (docs/processors.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ackline.commands import Subparsers
from ackline.settings import Settings

if TYPE_CHECKING:
    import asyncpg

    from ackline.sinks.feed.types import Cursor


def _dsn(settings: Settings) -> str:
    """PostgreSQL only: ACKLINE_DATABASE_URL (with the TLS settings), else the local stack."""
    if settings.database_url is not None:
        from ackline.clients import database_dsn

        return database_dsn(settings.database_url.get_secret_value(), settings)
    from ackline.endpoints import endpoints

    return endpoints(settings)[1]


@contextmanager
def _stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """SIGTERM/SIGINT set ``stop``: the batch in hand commits, then the loop returns."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


class _StdoutClosed(Exception):
    """stdout's reader went away: stop tailing, quietly."""


def cmd_tail(args: argparse.Namespace, settings: Settings) -> int:
    return asyncio.run(_tail(args, _dsn(settings)))


async def _tail(args: argparse.Namespace, dsn: str) -> int:
    from ackline.sinks.errors import FeedError
    from ackline.sinks.feed.changefeed import (
        AnyReader,
        Changefeed,
        LocalReader,
        Reader,
        connector,
        follow,
    )
    from ackline.sinks.feed.types import START, Cursor, FeedBatch, Filter, event_line

    if args.limit is not None and args.limit < 1:
        raise FeedError("--limit must be at least 1")
    if args.commit and not args.reader:
        raise FeedError("--commit needs --reader NAME")
    feed = Changefeed(Filter.of(args.types, args.agents))
    connect = connector(dsn, f"ackline-tail:{args.reader or '-'}")
    reader: AnyReader
    if args.commit:
        reader = Reader(args.reader, feed)
    else:
        start = START
        if args.from_cursor:
            start = Cursor.decode(args.from_cursor)
        elif args.reader:
            start = await _saved_cursor(connect, args.reader)
        reader = LocalReader(feed, start=start)

    async def handle(conn: asyncpg.Connection, batch: FeedBatch) -> None:
        # Inside the reader's transaction: with --commit the cursor commits after the
        # lines are flushed, so a crash in between prints them again (at least once).
        try:
            for event in batch.events:
                sys.stdout.write(event_line(event) + "\n")
            sys.stdout.flush()
        except BrokenPipeError as exc:  # an OSError, which follow() would retry
            raise _StdoutClosed() from exc

    stop = asyncio.Event()
    with _stop_on_signals(stop):
        try:
            cursor = await follow(
                reader,
                connect,
                handle,
                stop,
                wait=args.follow,
                poll_interval=args.poll_interval,
                limit=args.limit,
            )
        except _StdoutClosed:
            # the reader of our stdout left (`| head`); with --commit the batch rolled back
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
    print(f"ackline tail: cursor {cursor.encode()}", file=sys.stderr)
    return 0


async def _saved_cursor(
    connect: Callable[[], Awaitable[asyncpg.Connection]], reader: str
) -> Cursor:
    from ackline.sinks.errors import FeedError
    from ackline.sinks.feed.changefeed import saved_cursor

    conn = await connect()
    try:
        cursor = await saved_cursor(conn, reader)
    finally:
        await conn.close()
    if cursor is None:
        raise FeedError(f"no reader named {reader!r} (feed_cursors has no row for it)")
    return cursor


def cmd_dispatch(args: argparse.Namespace, settings: Settings) -> int:
    return asyncio.run(_dispatch(args, settings, _dsn(settings)))


async def _dispatch(args: argparse.Namespace, settings: Settings, dsn: str) -> int:
    """The dispatcher processor (`ackline process dispatcher`), under its older name.

    Kept for compatibility: it connects with the operator's DSN as it always did, names
    its cursor ``--reader`` and prints the same summary line.
    """
    import json
    import logging

    from ackline.core.faults import Faults
    from ackline.sinks.feed.changefeed import connector
    from ackline.sinks.feed.dispatcher import Dispatcher
    from ackline.sinks.feed.processors.contract import check
    from ackline.sinks.feed.processors.runner import Outcome, ProcessorRunner

    instance = args.instance or settings.worker_id
    dispatcher = Dispatcher(args.reader)
    runner = ProcessorRunner(
        check(dispatcher, f"dispatcher {args.reader!r}"),
        instance=instance,
        faults=Faults(settings.faults, settings.fault_stall_seconds),
        max_transactions=args.max_transactions,
        poll_interval=args.poll_interval,
    )
    connect = connector(
        dsn,
        f"ackline-dispatch:{instance}",
        idle_in_transaction_timeout_ms=settings.db_idle_in_transaction_timeout_ms,
    )
    log = logging.getLogger("ackline.dispatch")
    stop = asyncio.Event()
    with _stop_on_signals(stop):
        # Logged once SIGTERM is handled: from here a stop request exits 0.
        log.info("dispatcher %s following the feed as reader %s", instance, args.reader)
        report = await runner.run(connect, stop, wait=not args.once)
    summary = {
        "reader": args.reader,
        "instance": instance,
        "started": dispatcher.started,
        "already_started": dispatcher.already_started,
        "transactions": runner.reader.stats.transactions,
        "lost_races": report.lost_races,
        "cursor": report.cursor,
    }
    print(json.dumps(summary), flush=True)
    return 1 if report.outcome is Outcome.FAILED else 0


def register(sub: Subparsers) -> None:
    tail = sub.add_parser(
        "tail", help="print ingested events in changefeed order, one JSON object a line"
    )
    src = tail.add_mutually_exclusive_group(required=True)
    src.add_argument("--reader", help="start at this reader's saved cursor")
    src.add_argument("--from-cursor", help="start after this cursor (a line's 'cursor')")
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
    tail.add_argument("--limit", type=int, help="stop after N events")
    tail.add_argument("--poll-interval", type=float, default=2.0, help="fallback poll, seconds")
    tail.set_defaults(handler=cmd_tail)

    disp = sub.add_parser(
        "dispatch",
        help="start one agent run per agent.requested event "
        "(the dispatcher processor; same as `ackline process dispatcher`)",
    )
    disp.add_argument("--reader", default="dispatcher", help="cursor name, shared by instances")
    disp.add_argument("--instance", help="this instance's name (default ACKLINE_WORKER_ID)")
    disp.add_argument("--once", action="store_true", help="exit once caught up")
    disp.add_argument("--poll-interval", type=float, default=2.0, help="fallback poll, seconds")
    disp.add_argument("--max-transactions", type=int, default=64, help="per feed transaction")
    disp.set_defaults(handler=cmd_dispatch)
