"""`ackline dev up|down|status`: the local Kafka + PostgreSQL stack."""

from __future__ import annotations

import argparse
import json

from ackline.commands import Subparsers, uses
from ackline.core.errors import AcklineError
from ackline.settings import Settings


def cmd_dev(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.commands.guard import reason
    from ackline.dev import stack

    try:
        if args.action == "up":
            info = stack.up(settings.state_dir)
            print(f"kafka      {info.kafka_bootstrap}\npostgresql {info.database_url}")
        elif args.action == "down":
            stack.down(settings.state_dir)
            print("local stack stopped")
        else:
            print(json.dumps(stack.status(settings.state_dir), indent=2, default=str))
    except PermissionError as exc:
        raise AcklineError(
            f"cannot write the state directory {settings.state_dir.absolute()} "
            f"({exc.filename}: {reason(exc)}): set ACKLINE_STATE_DIR to a writable directory, "
            "or fix its permissions"
        ) from exc
    return 0


def register(sub: Subparsers) -> None:
    dev = sub.add_parser(
        "dev",
        help="the local Kafka + PostgreSQL stack",
        description="State (data, logs, ports) lives under ACKLINE_STATE_DIR (default .ackline).",
    )
    dev.add_argument(
        "action",
        choices=["up", "down", "status"],
        help="up: start (idempotent); down: stop everything; status: what runs, as JSON",
    )
    dev.set_defaults(handler=cmd_dev)
    uses(dev, why="it manages the local stack only")
