"""`ackline dev up|down|status`: the local Kafka + PostgreSQL stack."""

from __future__ import annotations

import argparse
import json

from ackline.commands import Subparsers
from ackline.settings import Settings


def cmd_dev(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.dev import stack

    if args.action == "up":
        info = stack.up(settings.state_dir)
        print(f"kafka      {info.kafka_bootstrap}\npostgresql {info.database_url}")
    elif args.action == "down":
        stack.down(settings.state_dir)
        print("local stack stopped")
    else:
        print(json.dumps(stack.status(settings.state_dir), indent=2, default=str))
    return 0


def register(sub: Subparsers) -> None:
    dev = sub.add_parser("dev", help="the local Kafka + PostgreSQL stack")
    dev.add_argument("action", choices=["up", "down", "status"])
    dev.set_defaults(handler=cmd_dev)
