"""`ackline chaos`: the guarantees under crashes, restarts and zombies (load/chaos), and
with ``--faults`` under network, cluster, failover and disk faults (docs/faults.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ackline.commands import Subparsers, uses
from ackline.settings import Settings


def cmd_chaos(args: argparse.Namespace, settings: Settings) -> int:
    if args.faults:
        return _infra(args, settings)
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
        writer_connections=_connections(args.writer_connections),
        produce_rate=args.produce_rate or 0.0,
        keep_stack=args.keep,
        processor_kills=args.processor_kills,
    )
    report = run_chaos(cfg)
    print(report.render(), flush=True)
    print(json.dumps(report.to_json()), flush=True)
    return 0 if report.ok else 1


def _infra(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.core.errors import SettingsError
    from ackline.load.chaos.infra import run_infra_chaos
    from ackline.load.chaos.infra_model import InfraConfig
    from ackline.load.chaos.infra_plan import CLASSES, Minimums

    if args.writer_connections:
        raise SettingsError("--writer-connections", "not taken with --faults (infra chaos)")
    classes = tuple(c for c in (x.strip() for x in args.faults.split(",")) if c)
    unknown = sorted(set(classes) - set(CLASSES))
    if unknown or not classes:
        raise SettingsError(
            "--faults", f"{unknown or args.faults!r}: use some of {','.join(CLASSES)}"
        )
    minimums = Minimums(
        pg_holes=args.pg_blackholes,
        kafka_holes=args.kafka_blackholes,
        resets=args.resets,
        leader_kills=args.leader_kills,
        rolls=args.broker_rolls,
        failovers_sync=args.sync_failovers,
        failovers_async=args.async_failovers,
        disk_full=args.disk_full,
    )
    cfg = InfraConfig(
        events=args.events,
        workers=args.workers,
        partitions=args.partitions,
        classes=tuple(c for c in CLASSES if c in classes),
        seed=args.seed,
        runtime=args.runtime,
        group_protocol=args.group_protocol,
        state_dir=Path(args.state_dir) if args.state_dir else settings.state_dir / "chaos-infra",
        batch_max_events=args.batch_max_events,
        produce_rate=1500.0 if args.produce_rate is None else args.produce_rate,
        minimums=minimums,
        keep_stack=args.keep,
    )
    # A SIGTERM unwinds the run (ackline.cli raises Terminated), so that its stack (mounts,
    # servers) is stopped on the way out.
    report = run_infra_chaos(cfg)
    print(report.render(), flush=True)
    print(json.dumps(report.to_json()), flush=True)
    return 0 if report.ok else 1


def _connections(text: str) -> tuple[int, ...]:
    from ackline.core.errors import SettingsError

    if not text:
        return ()
    try:
        counts = tuple(int(x) for x in text.split(","))
    except ValueError:
        counts = ()
    if not counts or not all(1 <= c <= 8 for c in counts):
        raise SettingsError("--writer-connections", f"{text!r}: a comma list of counts from 1 to 8")
    return counts


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
        "--writer-connections",
        default="",
        help="the workers' ACKLINE_WRITER_CONNECTIONS, a comma list given to the workers in "
        "turn (1,2: a group mixing one and two connections; default: the setting's default; "
        "not for --faults)",
    )
    p.add_argument(
        "--produce-rate",
        type=float,
        default=None,
        help="events/s cap of the producer (0: none; default 0, with --faults 1500)",
    )
    p.add_argument(
        "--processor-kills",
        type=int,
        default=4,
        help="minimum SIGKILLs of the runs processor run beside the workers (0: none runs)",
    )
    infra = p.add_argument_group(
        "infrastructure faults",
        "--faults runs the second mode instead (docs/faults.md): a stack of three brokers, a "
        "PostgreSQL primary and standby and fault proxies (default <state_dir>/chaos-infra); "
        "the process-fault minimums above do not apply to it",
    )
    infra.add_argument(
        "--faults",
        default="",
        help="comma list of network,cluster,failover,disk (all: make chaos-infra)",
    )
    infra.add_argument("--pg-blackholes", type=int, default=5, help="of a worker's PostgreSQL link")
    infra.add_argument("--kafka-blackholes", type=int, default=5, help="of a worker's Kafka links")
    infra.add_argument("--resets", type=int, default=3, help="connection resets")
    infra.add_argument("--leader-kills", type=int, default=3, help="SIGKILLs of a busy leader")
    infra.add_argument("--broker-rolls", type=int, default=1, help="rolling restarts")
    infra.add_argument(
        "--sync-failovers", type=int, default=1, help="PostgreSQL failovers, synchronous"
    )
    infra.add_argument(
        "--async-failovers", type=int, default=1, help="PostgreSQL failovers losing commits"
    )
    infra.add_argument("--disk-full", type=int, default=1, help="disk-full episodes")
    p.add_argument("--state-dir", default=None, help="the chaos stack's state directory")
    p.add_argument("--keep", action="store_true", help="leave the chaos stack running")
    p.set_defaults(handler=cmd_chaos)
    uses(p, why="it runs on its own stack, topic and group")
