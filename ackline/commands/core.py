"""Core commands: migrate, run, produce, verify, schema, demo."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from ackline.commands import Subparsers
from ackline.endpoints import endpoints
from ackline.settings import Settings


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    import asyncpg

    from ackline.sinks.admin.migrate import migrate

    _, dsn = endpoints(settings)

    async def go() -> list[int]:
        conn = await asyncpg.connect(dsn)
        try:
            return await migrate(conn)
        finally:
            await conn.close()

    applied = asyncio.run(go())
    print(f"applied migrations {applied}" if applied else "schema is up to date")
    return 0


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.runtime import run

    bootstrap, dsn = endpoints(settings)
    return run(settings, bootstrap, dsn, runtime=args.runtime, until_drained=args.until_drained)


def cmd_produce(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.clients import kafka_client_config
    from ackline.load.produce import Knobs, produce

    bootstrap, _ = endpoints(settings)
    knobs = Knobs(
        redeliver=args.redeliver,
        retry=args.retry,
        conflict_ledger=args.conflict_ledger,
        conflict_pk=args.conflict_pk,
        poison=args.poison,
        abort=args.abort,
    )
    produce(
        bootstrap,
        settings.topic,
        partitions=args.partitions,
        events=args.events,
        knobs=knobs,
        seed=args.seed,
        manifest_path=Path(args.manifest),
        progress=not args.quiet,
        client_conf=kafka_client_config(settings),
    )
    return 0


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.load.verify import print_summary, verify

    _, dsn = endpoints(settings)
    verdict = asyncio.run(verify(dsn, Path(args.manifest), settings.group_id))
    if args.json:
        print(json.dumps(verdict.to_json()))
    else:
        print_summary(verdict)
    return 0 if verdict.ok else 1


def cmd_schema(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.schemas.jsonschema import envelope_json_schema

    text = json.dumps(envelope_json_schema(), indent=2, sort_keys=True) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8")
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.demo import demo

    return demo(settings, events=args.events, keep=args.keep)


def register(sub: Subparsers) -> None:
    sub.add_parser("migrate", help="apply pending SQL migrations").set_defaults(handler=cmd_migrate)

    run = sub.add_parser("run", help="consume the topic into PostgreSQL until SIGTERM")
    run.add_argument("--until-drained", action="store_true", help="stop once caught up")
    run.add_argument(
        "--runtime",
        choices=("confluent", "faust"),
        help="consumer runtime (else ACKLINE_RUNTIME, default confluent); "
        "faust needs the [faust] extra, docs/faust.md",
    )
    run.set_defaults(handler=cmd_run)

    prod = sub.add_parser("produce", help="generate realistic agent activity with faults")
    prod.add_argument("--events", type=int, default=100_000)
    prod.add_argument("--partitions", type=int, default=12)
    prod.add_argument("--seed", type=int, default=1)
    prod.add_argument("--manifest", default=".ackline/manifest.jsonl.gz")
    prod.add_argument("--redeliver", type=float, default=0.03)
    prod.add_argument("--retry", type=float, default=0.02)
    prod.add_argument("--conflict-ledger", type=float, default=0.002)
    prod.add_argument("--conflict-pk", type=float, default=0.002)
    prod.add_argument("--poison", type=float, default=0.002)
    prod.add_argument("--abort", type=float, default=0.02)
    prod.add_argument("--quiet", action="store_true")
    prod.set_defaults(handler=cmd_produce)

    ver = sub.add_parser("verify", help="compare a produce manifest with the database")
    ver.add_argument("--manifest", default=".ackline/manifest.jsonl.gz")
    ver.add_argument("--json", action="store_true", help="print one JSON object")
    ver.set_defaults(handler=cmd_verify)

    sch = sub.add_parser("schema", help="export the event JSON Schema")
    sch.add_argument("output", nargs="?", default="-")
    sch.set_defaults(handler=cmd_schema)

    demo = sub.add_parser("demo", help="end to end: stack, migrate, produce, run, verify")
    demo.add_argument("--events", type=int, default=100_000)
    demo.add_argument("--keep", action="store_true", help="leave the stack running")
    demo.set_defaults(handler=cmd_demo)
