"""Operator commands that read: status, conflicts list|show, rejects list|show."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ackline.commands import Subparsers
from ackline.endpoints import endpoints
from ackline.settings import Settings

T = TypeVar("T")


def _with_db(dsn: str, query: Callable[[Any], Awaitable[T]]) -> T:
    import asyncpg

    async def go() -> T:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            return await query(conn)
        finally:
            await conn.close()

    return asyncio.run(go())


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from ackline import status
    from ackline.clients import kafka_client_config
    from ackline.streams.errors import TopicError
    from ackline.streams.kafkainfo import topic_offsets

    bootstrap, dsn = endpoints(settings)
    topic, group = settings.topic, settings.group_id
    kafka = topic_offsets(bootstrap, kafka_client_config(settings), group, topic)
    if kafka is None:
        raise TopicError(f"topic {topic} does not exist on {bootstrap}")
    db = _with_db(dsn, lambda conn: status.db_offsets(conn, group, topic))
    rows = status.merge(db, kafka)
    if args.json:
        _print_json(status.to_json(topic, group, rows))
    else:
        print(status.render(topic, group, rows))
    return 0


def cmd_conflicts(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.render import short_hex, table
    from ackline.sinks.admin import inspect

    _, dsn = endpoints(settings)
    group = settings.group_id
    if args.action == "show":
        detail = _with_db(dsn, lambda conn: inspect.get_conflict(conn, group, args.id))
        if args.json:
            _print_json(detail.to_json())
        else:
            print(_conflict_text(detail))
        return 0
    rows = _with_db(dsn, lambda conn: inspect.list_conflicts(conn, group, args.limit))
    if args.json:
        _print_json([r.to_json() for r in rows])
        return 0
    print(
        table(
            ("id", "layer", "source", "txn_id", "stored hash", "incoming hash", "detected"),
            [
                (
                    r.conflict_id,
                    r.layer,
                    f"{r.topic}[{r.partition}]@{r.offset}",
                    r.txn_id,
                    short_hex(r.stored_hash),
                    short_hex(r.incoming_hash),
                    r.detected_at.isoformat(timespec="seconds"),
                )
                for r in rows
            ],
        )
    )
    return 0


def _conflict_text(detail: Any) -> str:
    from ackline.render import safe_text

    r = detail.row
    lines = [
        f"conflict {r.conflict_id} ({r.layer} layer), batch {r.batch_id}, {r.detected_at}",
        f"source         {r.topic}[{r.partition}]@{r.offset}",
        f"txn_id         {r.txn_id}",
        f"event_id       {r.event_id} (stored: {r.stored_event_id})",
        f"stored hash    {r.stored_hash.hex()}",
        f"incoming hash  {r.incoming_hash.hex()}",
        "incoming body:",
        json.dumps(detail.incoming_body, indent=2, sort_keys=True),
        "stored row:",
        json.dumps(detail.stored, indent=2, sort_keys=True) if detail.stored else "(not found)",
    ]
    return safe_text("\n".join(lines), keep_newlines=True)


def cmd_rejects(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.render import safe_text, show_bytes, table
    from ackline.sinks.admin import inspect

    _, dsn = endpoints(settings)
    group = settings.group_id
    if args.action == "show":
        d = _with_db(dsn, lambda conn: inspect.get_reject(conn, group, args.id))
        if args.json:
            _print_json(d.to_json())
            return 0
        r = d.row
        print(
            "\n".join(
                [
                    f"reject {r.reject_id}: {r.reason}, batch {r.batch_id}, {r.rejected_at}",
                    f"source       {r.topic}[{r.partition}]@{r.offset}",
                    f"dead letter  {r.dlq_topic}[{r.dlq_partition}]@{r.dlq_offset}",
                    f"detail       {safe_text(r.detail)}",
                    f"headers      {safe_text(json.dumps(d.headers))}",
                    f"key          {show_bytes(d.raw_key, args.raw, args.max_bytes)}",
                    f"value ({r.value_bytes} bytes{', base64' if args.raw else ''}):",
                    show_bytes(d.raw_value, args.raw, args.max_bytes),
                ]
            )
        )
        return 0
    rows = _with_db(dsn, lambda conn: inspect.list_rejects(conn, group, args.limit))
    if args.json:
        _print_json([r.to_json() for r in rows])
        return 0
    print(
        table(
            ("id", "reason", "source", "dead letter", "bytes", "rejected", "detail"),
            [
                (
                    r.reject_id,
                    r.reason,
                    f"{r.topic}[{r.partition}]@{r.offset}",
                    f"{r.dlq_topic}[{r.dlq_partition}]@{r.dlq_offset}",
                    r.value_bytes,
                    r.rejected_at.isoformat(timespec="seconds"),
                    r.detail[:60],
                )
                for r in rows
            ],
        )
    )
    return 0


def _list_or_show(sub: Subparsers, name: str, help: str, raw: bool) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help=help)
    actions = p.add_subparsers(dest="action", required=True)
    ls = actions.add_parser("list", help=f"the newest {name} of the group")
    ls.add_argument("--limit", type=int, default=20)
    ls.add_argument("--json", action="store_true")
    show = actions.add_parser("show", help=f"one of the {name} in full")
    show.add_argument("id", type=int)
    show.add_argument("--json", action="store_true")
    if raw:
        show.add_argument("--raw", action="store_true", help="key and value as base64")
        show.add_argument(
            "--max-bytes", type=int, default=4096, help="show at most N bytes (0: all)"
        )
    return p


def register(sub: Subparsers) -> None:
    st = sub.add_parser("status", help="per partition: DB offset, Kafka offset, lag, owner")
    st.add_argument("--json", action="store_true")
    st.set_defaults(handler=cmd_status)
    _list_or_show(sub, "conflicts", "replays whose body changed", raw=False).set_defaults(
        handler=cmd_conflicts
    )
    _list_or_show(sub, "rejects", "records that did not decode", raw=True).set_defaults(
        handler=cmd_rejects
    )
