"""`ackline doctor`: connectivity, migrations, grants and topic settings, pass/warn/fail."""

from __future__ import annotations

import argparse
import json

from ackline.commands import Subparsers, uses
from ackline.endpoints import endpoints
from ackline.settings import Settings


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    from ackline import doctor

    bootstrap, dsn = endpoints(settings)
    checks = doctor.gather(settings, bootstrap, dsn)
    if args.json:
        print(json.dumps(doctor.to_json(checks), indent=2))
    else:
        print(doctor.render(checks))
    return doctor.exit_status(checks)


def register(sub: Subparsers) -> None:
    p = sub.add_parser("doctor", help="check the services, schema, grants and topic settings")
    p.add_argument("--json", action="store_true", help="one JSON object: every check")
    p.set_defaults(handler=cmd_doctor)
    uses(p, "topic", "group_id")
