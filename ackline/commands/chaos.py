"""`ackline chaos`: the guarantees under crashes, restarts and zombies (load/chaos)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ackline.commands import Subparsers
from ackline.settings import Settings


def cmd_chaos(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.load.chaos.harness import ChaosConfig, run_chaos

    cfg = ChaosConfig(
        events=args.events,
        workers=args.workers,
        partitions=args.partitions,
        kills=args.kills,
        stops=args.stops,
        broker_restarts=args.broker_restarts,
        pg_restarts=args.pg_restarts,
        commit_faults=args.commit_faults,
        seed=args.seed,
        group_protocol=args.group_protocol,
        runtime=args.runtime,
        state_dir=Path(args.state_dir) if args.state_dir else settings.state_dir / "chaos",
        batch_max_events=args.batch_max_events,
        produce_rate=args.produce_rate,
        keep_stack=args.keep,
        processor_kills=args.processor_kills,
    )
    report = run_chaos(cfg)
    print(report.render(), flush=True)
    print(json.dumps(report.to_json()), flush=True)
    return 0 if report.ok else 1


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "chaos",
        help="prove exactly-once under kills, zombies, broker and PostgreSQL restarts",
        description="Runs on its own local stack (default <state_dir>/chaos), never the "
        "shared one. The last line printed is one JSON object; exit 1 when not ok.",
    )
    p.add_argument("--events", type=int, default=1_000_000, help="original events to produce")
    p.add_argument("--workers", type=int, default=3, help="`ackline run` workers in the group")
    p.add_argument("--partitions", type=int, default=12, help="partitions of the run's topic")
    p.add_argument("--kills", type=int, default=30, help="minimum SIGKILLs of workers")
    p.add_argument("--stops", type=int, default=3, help="minimum zombies (SIGSTOP/SIGCONT)")
    p.add_argument("--broker-restarts", type=int, default=2, help="minimum Kafka broker restarts")
    p.add_argument("--pg-restarts", type=int, default=2, help="minimum PostgreSQL restarts")
    p.add_argument("--commit-faults", type=int, default=10, help="backends killed at COMMIT")
    p.add_argument("--seed", type=int, default=None, help="reproduce a run (default: random)")
    p.add_argument(
        "--group-protocol",
        choices=("classic", "consumer"),
        default="classic",
        help="the workers' Kafka group protocol",
    )
    p.add_argument(
        "--runtime", choices=("confluent", "faust"), default="confluent", help="ackline run's"
    )
    p.add_argument(
        "--batch-max-events", type=int, default=1000, help="the workers' ACKLINE_BATCH_MAX_EVENTS"
    )
    p.add_argument(
        "--produce-rate", type=float, default=0.0, help="events/s cap of the producer (0: none)"
    )
    p.add_argument(
        "--processor-kills",
        type=int,
        default=4,
        help="minimum SIGKILLs of the runs processor run beside the workers (0: none runs)",
    )
    p.add_argument("--state-dir", default=None, help="the chaos stack's state directory")
    p.add_argument("--keep", action="store_true", help="leave the chaos stack running")
    p.set_defaults(handler=cmd_chaos)
