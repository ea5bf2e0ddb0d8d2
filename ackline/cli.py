"""The `ackline` command line. Thin: parse, load settings, call one function, exit."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ackline.errors import AcklineError
from ackline.settings import Settings, load_settings

log = logging.getLogger("ackline")

Handler = Callable[[argparse.Namespace, Settings], int]


def _endpoints(settings: Settings) -> tuple[str, str]:
    """(bootstrap, dsn): from the settings when both are set, else the local stack."""
    if settings.kafka_bootstrap and settings.database_url:
        return settings.kafka_bootstrap, settings.database_url.get_secret_value()
    from ackline.dev import stack

    info = stack.resolve(settings.state_dir)
    bootstrap = settings.kafka_bootstrap or info.kafka_bootstrap
    dsn = settings.database_url.get_secret_value() if settings.database_url else info.database_url
    return bootstrap, dsn


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


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    import asyncpg

    from sinks.migrate import migrate

    _, dsn = _endpoints(settings)

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
    from ackline.app import run

    bootstrap, dsn = _endpoints(settings)
    return asyncio.run(run(settings, bootstrap, dsn, until_drained=args.until_drained))


def cmd_produce(args: argparse.Namespace, settings: Settings) -> int:
    from load.produce import Knobs, produce

    bootstrap, _ = _endpoints(settings)
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
    )
    return 0


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    from load.verify import print_summary, verify

    _, dsn = _endpoints(settings)
    verdict = asyncio.run(verify(dsn, Path(args.manifest), settings.group_id))
    if args.json:
        print(json.dumps(verdict.to_json()))
    else:
        print_summary(verdict)
    return 0 if verdict.ok else 1


def cmd_schema(args: argparse.Namespace, settings: Settings) -> int:
    from schemas.jsonschema import envelope_json_schema

    text = json.dumps(envelope_json_schema(), indent=2, sort_keys=True) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8")
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.demo import demo

    return demo(settings, events=args.events, keep=args.keep)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ackline", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--topic", help="override ACKLINE_TOPIC")
    p.add_argument("--group-id", help="override ACKLINE_GROUP_ID")
    sub = p.add_subparsers(dest="command", required=True)

    dev = sub.add_parser("dev", help="the local Kafka + PostgreSQL stack")
    dev.add_argument("action", choices=["up", "down", "status"])
    dev.set_defaults(handler=cmd_dev)

    sub.add_parser("migrate", help="apply pending SQL migrations").set_defaults(handler=cmd_migrate)

    run = sub.add_parser("run", help="consume the topic into PostgreSQL until SIGTERM")
    run.add_argument("--until-drained", action="store_true", help="stop once caught up")
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
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    overrides: dict[str, Any] = {"topic": args.topic, "group_id": args.group_id}
    try:
        settings = load_settings(**overrides)
        handler: Handler = args.handler
        return handler(args, settings)
    except AcklineError as exc:
        print(f"ackline: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
