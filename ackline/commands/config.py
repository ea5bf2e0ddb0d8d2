"""`ackline config show`: the effective settings, secrets redacted, with their sources."""

from __future__ import annotations

import argparse
import json

from ackline.commands import Subparsers
from ackline.render import table
from ackline.settings import ENV_PREFIX, Settings


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    values = settings.redacted()
    sources = settings.sources()
    if args.json:
        print(
            json.dumps(
                {name: {"value": v, "source": sources[name]} for name, v in values.items()},
                indent=2,
                default=str,
            )
        )
        return 0
    rows = [(ENV_PREFIX + name.upper(), v, sources[name]) for name, v in values.items()]
    print(table(("setting", "value", "source"), rows))
    return 0


def register(sub: Subparsers) -> None:
    p = sub.add_parser("config", help="the effective settings")
    actions = p.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", help="print every setting (secrets redacted) and its source")
    show.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_config)
