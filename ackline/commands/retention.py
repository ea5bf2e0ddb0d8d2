"""`ackline retention` and `ackline partitions`: the time partitions of activity.

``retention apply --older-than 90d`` records the policy (the least the workers'
``ACKLINE_RETENTION`` may keep) and detaches and drops every partition ingested entirely
before then; ``retention show`` prints the policy, the partitions and the last drops.
``partitions list`` and ``partitions ensure`` list and make partitions (the workers make
them ahead by themselves). All connect with the operator's DSN (docs/retention.md).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from ackline.commands import Subparsers, uses, whole_from
from ackline.commands.guard import on_database
from ackline.core.errors import AcklineError
from ackline.core.signals import run_stoppable
from ackline.settings import PARTITIONS_AHEAD_MAX, Settings
from ackline.sinks.admin.durations import retention_period

if TYPE_CHECKING:
    import asyncpg

T = TypeVar("T")

_DROPS = """
SELECT partition_name, lower_day, upper_day, approx_rows, forced, readers_behind,
       dropped_by, dropped_at
FROM retention_drops ORDER BY drop_id DESC LIMIT 10
"""


def _with_db(settings: Settings, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    return run_stoppable(on_database(settings, work))


def older_than(text: str) -> timedelta:
    """An argparse type: a retention period with its unit (``90d``, ``12w``, ``36h``),
    refused when parsed. It is saved as the policy: a bare ``90`` is not guessed."""
    try:
        return retention_period(text, unit_required=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _keep(args: argparse.Namespace, settings: Settings) -> timedelta:
    if args.older_than is not None:
        keep: timedelta = args.older_than
        return keep
    if not settings.retention:
        raise AcklineError("retention apply needs --older-than (or ACKLINE_RETENTION)")
    return retention_period(settings.retention)  # checked and normalized when loaded


def cmd_apply(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.sinks.admin.durations import format_duration
    from ackline.sinks.admin.partitions import apply_retention

    keep = _keep(args, settings)
    dropped = _with_db(settings, lambda conn: apply_retention(conn, keep, force=args.force))
    if args.json:
        print(
            json.dumps(
                {
                    "older_than": format_duration(keep),
                    "partitions": [
                        {
                            "name": d.name,
                            "from": None if d.lower_day is None else d.lower_day.isoformat(),
                            "until": None if d.upper_day is None else d.upper_day.isoformat(),
                            "dropped": d.dropped,
                            "readers_behind": list(d.readers_behind),
                        }
                        for d in dropped
                    ],
                }
            )
        )
    else:
        print(f"retention policy: keep {format_duration(keep)} (workers never keep less)")
        if not dropped:
            print("no partition is older than that")
        for d in dropped:
            span = (
                "rows stored before partitioning"
                if d.lower_day is None
                else (f"ingested {d.lower_day} .. {d.upper_day}")
            )
            if d.dropped:
                forced = f" (forced past readers {', '.join(d.readers_behind)})" * bool(
                    d.readers_behind
                )
                print(f"dropped {d.name}: {span}{forced}")
            else:
                print(
                    f"kept {d.name}: {span}; changefeed readers "
                    f"{', '.join(d.readers_behind)} have not read it all (--force drops it)"
                )
    return 0 if all(d.dropped for d in dropped) else 1


def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.sinks.admin.durations import format_duration
    from ackline.sinks.admin.partitions import list_partitions, retention_policy

    async def read(conn: asyncpg.Connection) -> tuple[Any, Any, Any]:
        return (
            await retention_policy(conn),
            await list_partitions(conn),
            await conn.fetch(_DROPS),
        )

    policy, parts, drops = _with_db(settings, read)
    if args.json:
        print(
            json.dumps(
                {
                    "min_keep": None if policy is None else format_duration(policy),
                    "worker_retention": settings.retention or None,
                    "partitions": [_partition_json(p) for p in parts],
                    "last_drops": [
                        {k: (str(v) if v is not None else None) for k, v in dict(d).items()}
                        for d in drops
                    ],
                }
            )
        )
        return 0
    print(
        "retention policy: "
        + ("none (workers drop nothing)" if policy is None else f"keep {format_duration(policy)}")
    )
    print(f"this host's ACKLINE_RETENTION: {settings.retention or 'off'}")
    _print_partitions(parts)
    for d in drops:
        print(f"dropped {d['partition_name']} at {d['dropped_at']} by {d['dropped_by']}")
    return 0


def _partition_json(p: Any) -> dict[str, Any]:
    return {
        "name": p.name,
        "from": None if p.lower_day is None else p.lower_day.isoformat(),
        "until": None if p.upper_day is None else p.upper_day.isoformat(),
        "ends_before": p.ends_before.isoformat(),
        "approx_rows": p.approx_rows,
        "bytes": p.bytes,
    }


def _print_partitions(parts: list[Any]) -> None:
    print(f"{'partition':<22}{'from':>12}{'until':>12}{'~rows':>14}{'MB':>10}")
    for p in parts:
        lo = "-" if p.lower_day is None else p.lower_day.isoformat()
        hi = "-" if p.upper_day is None else p.upper_day.isoformat()
        print(f"{p.name:<22}{lo:>12}{hi:>12}{p.approx_rows:>14,}{p.bytes / 1e6:>10,.1f}")


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.sinks.admin.partitions import list_partitions

    parts = _with_db(settings, list_partitions)
    if args.json:
        print(json.dumps([_partition_json(p) for p in parts]))
    else:
        _print_partitions(parts)
    return 0


def cmd_ensure(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.sinks.admin.partitions import ensure_partitions

    interval = args.interval or settings.partition_interval
    ahead = settings.partitions_ahead if args.ahead is None else args.ahead
    made = _with_db(settings, lambda conn: ensure_partitions(conn, interval, ahead))
    for m in made:
        print(f"made {m.name}: {m.lower_day} .. {m.upper_day}")
    if not made:
        print(f"every partition up to {ahead} {interval}(s) ahead exists")
    return 0


def register(sub: Subparsers) -> None:
    p = sub.add_parser("retention", help="drop old activity partitions; the retention policy")
    actions = p.add_subparsers(dest="action", required=True)
    apply = actions.add_parser("apply", help="record the policy and drop partitions older than it")
    apply.add_argument(
        "--older-than",
        metavar="DURATION",
        type=older_than,
        help="a number and its unit (s, m, h, d, w): 90d, 12w, 36h; at least 1d "
        "(default: ACKLINE_RETENTION)",
    )
    apply.add_argument(
        "--force",
        action="store_true",
        help="drop partitions that a changefeed reader has not read all of",
    )
    apply.add_argument("--json", action="store_true", help="one JSON object")
    apply.set_defaults(handler=cmd_apply)
    show = actions.add_parser("show", help="the policy, the partitions, the last drops")
    show.add_argument("--json", action="store_true", help="one JSON object")
    show.set_defaults(handler=cmd_show)

    q = sub.add_parser("partitions", help="the time partitions of activity")
    qa = q.add_subparsers(dest="action", required=True)
    lst = qa.add_parser("list", help="partitions, oldest first, with sizes")
    lst.add_argument("--json", action="store_true", help="one JSON array")
    lst.set_defaults(handler=cmd_list)
    ens = qa.add_parser("ensure", help="make the partitions of today and ahead")
    ens.add_argument("--interval", choices=("day", "week"), help="ACKLINE_PARTITION_INTERVAL")
    ens.add_argument(
        "--ahead",
        type=whole_from(1, PARTITIONS_AHEAD_MAX),
        help=f"ACKLINE_PARTITIONS_AHEAD (1 to {PARTITIONS_AHEAD_MAX})",
    )
    ens.set_defaults(handler=cmd_ensure)
    for each in (apply, show, lst, ens):
        uses(each, why="the activity partitions hold every topic and group ingested")
