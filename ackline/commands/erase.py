"""`ackline erase --agent ID | --request ID | --event ID`: erasure a replay cannot undo.

Removes the activity rows (and the bodies kept in conflicts and rejects) of an agent, a
request or one event in one transaction, keeps their keys and hashes as tombstones and
writes an audit row (sinks/admin/erase.py, docs/retention.md). It runs as
``ackline_eraser``: with ``SET ROLE`` when the operator's login (ACKLINE_DATABASE_URL) is
a member, else the login itself must have its privileges. Prints what it erased and the
Kafka records it cannot erase (dead-letter copies, source records). Exit 0 when it
committed (even with nothing to erase: a request for a subject with no data is honoured,
and audited), 2 on an error (nothing erased); nothing matched is a WARNING, since the
match is exact and a mistyped id is otherwise indistinguishable from a clean erasure.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from ackline.commands import Subparsers, uses
from ackline.commands.guard import on_database, with_migrate_fix
from ackline.core.signals import run_stoppable
from ackline.settings import Settings

if TYPE_CHECKING:
    import asyncpg

log = logging.getLogger("ackline.erase")


def cmd_erase(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.sinks.admin.erase import Erasure, ErasureError, Selector, check_value, erase

    selector: Selector
    if args.agent is not None:
        selector, value = "agent", args.agent
    elif args.request is not None:
        selector, value = "request", args.request
    else:
        selector, value = "event", args.event
    value = check_value(selector, value)

    def go(conn: asyncpg.Connection) -> Awaitable[Erasure]:
        return erase(conn, selector, value, reason=args.reason, dry_run=args.dry_run)

    try:  # unreachable: the address and a fix (on_database)
        done = run_stoppable(on_database(settings, go))
    except ErasureError as exc:  # nothing erased; on a database never migrated, the fix
        line = with_migrate_fix(
            str(exc), exc.__cause__, "it creates the erasure tables and the roles"
        )
        if line == str(exc):
            raise
        raise ErasureError(line) from exc.__cause__
    if done.events == done.conflicts == done.rejects == 0:
        log.warning(
            "nothing matched %s %r (erased already, or a mistyped id: matching is exact and "
            "case-sensitive)%s",
            selector,
            value,
            "" if done.dry_run else f"; erasure {done.erasure_id} is recorded all the same",
        )
    if args.json:
        print(json.dumps(done.to_json()))
        return 0
    what = "would erase" if done.dry_run else f"erasure {done.erasure_id} by {done.requested_by}:"
    print(
        f"{what} {selector} {value}: {done.events} events, "
        f"{done.conflicts} conflict bodies, {done.rejects} rejects"
    )
    for d in done.dead_letters:
        print(f"  not erased: dead-letter copy {d.topic}[{d.partition}]@{d.offset}")
    for s in done.source:
        print(
            f"  not erased: {s.events} source records {s.topic}[{s.partition}] offsets "
            f"{s.first_offset}..{s.last_offset} (until the topic's retention deletes them)"
        )
    if done.dry_run:
        print("dry run: nothing changed")
    return 0


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "erase",
        help="erase an agent's, a request's or an event's activity (keys kept: a replay "
        "cannot bring it back)",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--agent", metavar="ID", help="every event of this agent_id")
    which.add_argument("--request", metavar="ID", help="every event of this request_id")
    which.add_argument("--event", metavar="UUID", help="one event_id")
    p.add_argument("--reason", default="", help="recorded in the audit row (a ticket id)")
    p.add_argument("--dry-run", action="store_true", help="count, change nothing")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(handler=cmd_erase)
    uses(p, why="it erases from every topic and group ingested")
