"""Operator commands that read: status, conflicts [list|show], rejects [list|show].

``conflicts`` and ``rejects`` without a subcommand list the newest 20.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from ackline.commands import Subparsers, uses, whole_from
from ackline.commands.guard import on_database
from ackline.core.signals import run_stoppable
from ackline.endpoints import endpoints
from ackline.settings import Settings

T = TypeVar("T")
DEFAULT_LIMIT = 20


def _with_db(settings: Settings, query: Callable[[Any], Awaitable[T]]) -> T:
    return run_stoppable(on_database(settings, query))


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from ackline import status
    from ackline.clients import kafka_client_config
    from ackline.sinks.ingest import incarnation
    from ackline.streams.errors import KafkaUnavailableError, TopicError
    from ackline.streams.kafkainfo import (
        GroupMember,
        group_members,
        scan_ranges,
        topic_id,
        topic_offsets,
    )

    bootstrap, _ = endpoints(settings)  # both named first: a missing one says so at once
    topic, group = settings.topic, settings.group_id
    conf = kafka_client_config(settings)
    kafka = topic_offsets(bootstrap, conf, group, topic)
    if kafka is None:
        raise TopicError(f"topic {topic} does not exist on {bootstrap}")

    async def read(conn: Any) -> tuple[list[status.OffsetRow], list[str], str | None]:
        db = await status.db_offsets(conn, group, topic)
        others = [] if db else await status.groups_with_offsets(conn, topic)
        return db, others, await incarnation.recorded_id(conn, group, topic)

    db, groups, recorded = _with_db(settings, read)
    try:  # the DB offsets may belong to another incarnation: their lag is then no lag
        current = topic_id(bootstrap, conf, topic)
    except KafkaUnavailableError as exc:
        print(f"ackline status: topic ID unknown ({exc})", file=sys.stderr)
        current = None
    notes = [
        n
        for n in (
            incarnation.mismatch_line(topic, group, recorded, current),
            status.no_offsets_note(db, group, topic, groups),
        )
        if n is not None
    ]
    note = "\n".join(notes) if notes else None
    starts, ends = status.unread_starts(db, kafka)
    _, settled = scan_ranges(bootstrap, conf, topic, starts, ends)
    try:
        members: list[GroupMember] | None = group_members(bootstrap, conf, group)
    except KafkaUnavailableError as exc:  # offsets were read: show them, liveness unknown
        print(f"ackline status: group members unknown ({exc})", file=sys.stderr)
        members = None
    rows = status.merge(db, kafka, settled=settled, members=members, topic=topic)
    if args.json:
        _print_json(status.to_json(topic, group, rows, current, recorded))
        if note is not None:  # beside the JSON, which stays one document
            print(f"ackline status: {note}", file=sys.stderr)
    else:
        print(status.render(topic, group, rows, note))
    return 0


def _truncation(shown: int, total: int, what: str, limit: int) -> str | None:
    if total <= shown:
        return None
    more = min(total, max(limit * 5, 100))
    return f"showing the newest {shown} of {total:,} {what} (--limit {more} for more)"


def _listing(
    settings: Settings,
    as_json: bool,
    what: str,
    limit: int,
    newest: Callable[[Any, int], Awaitable[list[Any]]],
    count: Callable[[Any], Awaitable[int]],
    header: tuple[str, ...],
    row: Callable[[Any], tuple[Any, ...]],
) -> int:
    """The newest ``limit`` rows of ``what`` as JSON or a table, and a note when there are
    more (on stderr beside JSON, so the JSON stays one document)."""
    from ackline.render import table

    async def listing(conn: Any) -> tuple[list[Any], int]:
        return await newest(conn, limit), await count(conn)

    rows, total = _with_db(settings, listing)
    if as_json:
        _print_json([r.to_json() for r in rows])
    else:
        print(table(header, [row(r) for r in rows]))
    note = _truncation(len(rows), total, what, limit)
    if note:
        print(note, file=sys.stderr if as_json else sys.stdout)
    return 0


def cmd_conflicts(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.render import short_hex
    from ackline.sinks.admin import inspect

    group = settings.group_id
    as_json = getattr(args, "json", False)
    if args.action == "show":
        detail = _with_db(settings, lambda conn: inspect.get_conflict(conn, group, args.id))
        if as_json:
            _print_json({**detail.to_json(), "changed": _changes(detail)})
        else:
            print(_conflict_text(detail))
        return 0
    return _listing(
        settings,
        as_json,
        "conflicts",
        getattr(args, "limit", DEFAULT_LIMIT),
        lambda conn, limit: inspect.list_conflicts(conn, group, limit),
        lambda conn: inspect.count_conflicts(conn, group),
        ("id", "layer", "source", "txn_id", "stored hash", "incoming hash", "detected"),
        lambda r: (
            r.conflict_id,
            r.layer,
            _source(r),
            r.txn_id,
            short_hex(r.stored_hash),
            short_hex(r.incoming_hash),
            r.detected_at.isoformat(timespec="seconds"),
        ),
    )


def _source(r: Any) -> str:
    """A row's source record; with its topic's ID where one is recorded, so two rows at
    one offset of a topic made again (after `offsets adopt-topic`) are told apart. Pure."""
    where = f"{r.topic}[{r.partition}]@{r.offset}"
    return f"{where} (topic ID {r.topic_id})" if r.topic_id else where


def stored_body(stored: dict[str, Any]) -> dict[str, Any]:
    """The canonical body (ackline.schemas.canonical) of a stored activity row, as the
    conflicts table keeps the incoming one: every envelope field but event_id. Pure."""
    moment = datetime.fromisoformat(str(stored["occurred_at"])).astimezone(UTC)
    return {
        "agent_id": stored["agent_id"],
        "occurred_at": moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "payload": stored["payload"],
        "request_id": stored["request_id"],
        "schema_version": stored["schema_version"],
        "txn_id": stored["txn_id"],
        "type": stored["type"],
    }


def _changes(detail: Any) -> list[str] | None:
    """The changed leaves, or None when either body is not there to compare."""
    from ackline.render import body_diff

    if detail.stored is None or detail.incoming_body is None:
        return None
    return body_diff(stored_body(detail.stored), detail.incoming_body)


def _erased(erasure_id: int) -> str:
    return f"(erased by erasure {erasure_id})"


def _conflict_text(detail: Any) -> str:
    """A conflict in full; a body an erasure removed is said to be erased, and by which
    erasure, never printed as null (as ``rejects show`` does)."""
    from ackline.render import safe_text

    r = detail.row
    changes = _changes(detail)
    if r.erasure_id is not None:
        incoming = _erased(r.erasure_id)
    else:
        incoming = json.dumps(detail.incoming_body, indent=2, sort_keys=True)
    if detail.stored is not None:
        stored = json.dumps(detail.stored, indent=2, sort_keys=True)
    elif detail.stored_erasure_id is not None:
        stored = _erased(detail.stored_erasure_id)
    else:
        stored = "(not found)"
    if changes is not None:
        changed = [f"  {line}" for line in changes] or ["  (no difference in the body)"]
    elif detail.stored is None and detail.stored_erasure_id is None:
        changed = ["  (the stored row is gone)"]
    else:
        changed = ["  (not known: a body was erased)"]
    lines = [
        f"conflict {r.conflict_id} ({r.layer} layer), batch {r.batch_id}, {r.detected_at}",
        f"source         {_source(r)}",
        f"txn_id         {r.txn_id}",
        f"event_id       {r.event_id} (stored: {r.stored_event_id})",
        f"stored hash    {r.stored_hash.hex()}",
        f"incoming hash  {r.incoming_hash.hex()}",
        "changed (stored -> incoming):",
        *changed,
        "incoming body:",
        incoming,
        "stored row:",
        stored,
    ]
    return safe_text("\n".join(lines), keep_newlines=True)


def cmd_rejects(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.render import safe_text, show_bytes
    from ackline.sinks.admin import inspect

    group = settings.group_id
    as_json = getattr(args, "json", False)
    if args.action == "show":
        d = _with_db(settings, lambda conn: inspect.get_reject(conn, group, args.id))
        if as_json:
            _print_json(d.to_json())
            return 0
        r = d.row
        head = [
            f"reject {r.reject_id}: {r.reason}, batch {r.batch_id}, {r.rejected_at}",
            f"source       {_source(r)}",
            f"dead letter  {r.dlq_topic}[{r.dlq_partition}]@{r.dlq_offset}",
            f"detail       {safe_text(r.detail)}",
        ]
        if r.erasure_id is not None:
            # an erasure cleared the raw record: say so instead of printing its NULLs
            erased = f"(erased by erasure {r.erasure_id})"
            body = [f"headers      {erased}", f"key          {erased}", f"value        {erased}"]
        else:
            value_bytes = "no" if r.value_bytes is None else r.value_bytes
            body = [
                f"headers      {safe_text(json.dumps(d.headers))}",
                f"key          {show_bytes(d.raw_key, args.raw, args.max_bytes)}",
                f"value ({value_bytes} bytes{', base64' if args.raw else ''}):",
                show_bytes(d.raw_value, args.raw, args.max_bytes),
            ]
        print("\n".join(head + body))
        return 0
    return _listing(
        settings,
        as_json,
        "rejects",
        getattr(args, "limit", DEFAULT_LIMIT),
        lambda conn, limit: inspect.list_rejects(conn, group, limit),
        lambda conn: inspect.count_rejects(conn, group),
        ("id", "reason", "source", "dead letter", "bytes", "rejected", "detail"),
        lambda r: (
            r.reject_id,
            r.reason,
            _source(r),
            f"{r.dlq_topic}[{r.dlq_partition}]@{r.dlq_offset}",
            r.value_bytes,
            r.rejected_at.isoformat(timespec="seconds"),
            r.detail[:60],
        ),
    )


def _list_or_show(sub: Subparsers, name: str, help: str, raw: bool) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name, help=f"{help} (no subcommand: list the newest {DEFAULT_LIMIT})"
    )
    actions = p.add_subparsers(dest="action", metavar="{list,show}")
    ls = actions.add_parser("list", help=f"the newest {name} of the group, and how many there are")
    ls.add_argument(
        "--limit",
        type=whole_from(1),
        default=DEFAULT_LIMIT,
        help=f"show at most N, newest first (default {DEFAULT_LIMIT})",
    )
    ls.add_argument("--json", action="store_true", help="a JSON array instead of a table")
    show = actions.add_parser("show", help=f"one of the {name} in full")
    show.add_argument("id", type=whole_from(1), help=f"its id (the first column of `{name} list`)")
    show.add_argument("--json", action="store_true", help="one JSON object")
    if raw:
        show.add_argument("--raw", action="store_true", help="key and value as base64")
        show.add_argument(
            "--max-bytes", type=whole_from(0), default=4096, help="show at most N bytes (0: all)"
        )
    for each in (p, ls, show):
        uses(each, "group_id", why=f"it shows the group's {name} on every topic")
    return p


def register(sub: Subparsers) -> None:
    st = sub.add_parser(
        "status", help="per partition: DB offset, Kafka offset, lag, owner and whether it is live"
    )
    st.add_argument("--json", action="store_true", help="one JSON object")
    st.set_defaults(handler=cmd_status)
    uses(st, "topic", "group_id")
    _list_or_show(sub, "conflicts", "replays whose body changed", raw=False).set_defaults(
        handler=cmd_conflicts
    )
    _list_or_show(sub, "rejects", "records that did not decode", raw=True).set_defaults(
        handler=cmd_rejects
    )
