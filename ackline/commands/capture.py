"""`ackline capture` and `ackline replay`: topic ranges to files and back, for load tests."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ackline.commands import Subparsers, seconds_up_to, uses, whole_from
from ackline.core.errors import AcklineError
from ackline.settings import Settings

if TYPE_CHECKING:
    from ackline.load.capture.topics import RangeSpec


class ArgumentProblem(AcklineError):
    """A command-line value is malformed or options do not go together."""


def parse_time_ms(text: str) -> int:
    """Epoch milliseconds from ``1714554000000`` or ISO 8601 (no zone: UTC)."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ArgumentProblem(
            f"{text!r} is neither ISO 8601 (2024-05-01T09:00:00Z) nor epoch milliseconds"
        ) from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _spec(args: argparse.Namespace) -> RangeSpec:
    from ackline.load.capture.topics import RangeSpec

    return RangeSpec(
        start_offset=args.from_offset,
        end_offset=args.to_offset,
        since_ms=parse_time_ms(args.since) if args.since else None,
        until_ms=parse_time_ms(args.until) if args.until else None,
        partitions=tuple(args.partition) if args.partition else None,
    )


def cmd_capture(args: argparse.Namespace, settings: Settings) -> int:
    """Order: check the output path (before any record is read), resolve the range, read
    it into ``<output>.partial``, rename. SIGTERM or an error removes the partial file."""
    from ackline.clients import kafka_client_config
    from ackline.core.progress import Progress
    from ackline.endpoints import kafka
    from ackline.load.capture.topics import capture
    from ackline.load.paths import check_target

    output = Path(args.output)
    check_target(
        output, what="capture file", overwrite=args.force, force_hint="pass --force to replace it"
    )
    bootstrap = kafka(settings)
    spec = _spec(args)
    bar: Progress | None = None

    def progress(done: int, bound: int) -> None:
        nonlocal bar
        if bar is None:
            bar = Progress("capture", bound, unit="records")
        bar.total = max(bound, done)
        bar.update(done)

    try:
        summary = capture(
            bootstrap,
            args.topic,
            output,
            spec,
            conf=kafka_client_config(settings),
            timeout=args.timeout,
            idle_timeout=args.idle_timeout,
            on_progress=None if args.quiet else progress,
            overwrite=args.force,
        )
    finally:
        if bar is not None:
            bar.close()
    print(summary.render(), flush=True)
    return 0


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.clients import kafka_client_config
    from ackline.core.progress import Progress
    from ackline.endpoints import kafka
    from ackline.load.capture.file import CaptureReader
    from ackline.load.capture.replay import Pace, needed_bytes, replay
    from ackline.load.capture.topics import open_range

    if bool(args.source) == bool(args.from_topic):
        raise ArgumentProblem("replay: give either a capture file or --from-topic TOPIC")
    if args.to == settings.topic and not args.into_ingested_topic:
        # A load test's capture replayed here is stored and acted on downstream (a second
        # agent started), where a load-test topic was meant: make that a decision.
        raise ArgumentProblem(
            f"replay: --to {args.to} is the topic ackline ingests (ACKLINE_TOPIC): what is "
            "replayed there is stored and acted on as real activity; pass "
            "--into-ingested-topic if that is meant (reprocessing dead letters, "
            "docs/schema.md), else name a load-test topic"
        )
    if args.target_partitions is not None and not args.create_topic:
        # an existing topic keeps its partitions: the count was dropped, unsaid
        raise ArgumentProblem(
            "replay: --partitions needs --create-topic (it is the count of the topic "
            "created; an existing one keeps its own)"
        )
    ranged = any(
        v is not None
        for v in (args.from_offset, args.to_offset, args.since, args.until, args.partition)
    )
    if ranged and not args.from_topic:
        raise ArgumentProblem(
            "replay: range options go with --from-topic (a file is replayed whole)"
        )
    pace = Pace.parse(args.pace)
    bootstrap = kafka(settings)
    conf = kafka_client_config(settings)
    if args.from_topic:
        spec = _spec(args)
        ranges, records = open_range(bootstrap, args.from_topic, spec, conf=conf)
        total = sum(end - first for first, end in ranges.values())
        partitions = list(ranges)
        reader = largest = None
        need = _source_limit(bootstrap, args.from_topic, conf) if args.create_topic else None
    else:
        reader = CaptureReader(Path(args.source))
        records = iter(reader)
        total = reader.trailer.records
        partitions = list(reader.header.ranges)
        largest = reader.largest_record()
        need = needed_bytes(largest)
    if args.create_topic:
        count = args.target_partitions or max(partitions) + 1
        _create_target(bootstrap, args.to, count, conf, need)
    bar = None if args.quiet else Progress("replay", total, unit="records")
    try:
        summary = replay(
            bootstrap,
            records,
            args.to,
            pace,
            source_partitions=partitions,
            keep_timestamps=args.keep_timestamps,
            conf=conf,
            on_progress=bar.update if bar is not None else None,
            stop_flush_timeout=settings.shutdown_wait_s / 2,
            largest=largest,
        )
    finally:
        if bar is not None:
            bar.close()
        if reader is not None:
            reader.close()
    print(summary.render(), flush=True)
    return 0


def _source_limit(bootstrap: str, topic: str, conf: dict[str, Any]) -> int | None:
    """The live source's ``max.message.bytes``: every record in it fits that, and reading
    them all to find the largest would cost a second pass over the range."""
    from ackline.streams.admin import max_message_bytes, topic_shape

    return max_message_bytes(topic_shape(bootstrap, topic, conf=conf))


def _create_target(
    bootstrap: str, topic: str, partitions: int, conf: dict[str, Any], need: int | None
) -> None:
    """Create ``topic`` so that records of ``need`` bytes fit (None: not known). Set only
    above the broker's own limit, which the topic inherits: never narrower than that."""
    from ackline.streams.admin import ensure_topic, topic_config_for

    config = topic_config_for(bootstrap, need, conf=conf)
    count = ensure_topic(bootstrap, topic, partitions, config, conf=conf)
    if count != partitions:
        import logging

        logging.getLogger("ackline.replay").info(
            "target topic %s exists with %d partitions (kept)", topic, count
        )


def _range_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from-offset", type=int, help="first offset, each partition (default: earliest)"
    )
    p.add_argument("--to-offset", type=int, help="end offset, exclusive (default: the end now)")
    p.add_argument("--since", help="first record time: ISO 8601 or epoch ms")
    p.add_argument("--until", help="end time, exclusive: ISO 8601 or epoch ms")
    p.add_argument("--partition", type=int, action="append", help="only this partition (repeat)")


def register(sub: Subparsers) -> None:
    cap = sub.add_parser(
        "capture", help="write a topic range (offsets or time window) to a capture file"
    )
    cap.add_argument("topic", help="the topic to read")
    cap.add_argument(
        "output",
        help="capture file to write (e.g. range.ackcap); its missing folders are made once "
        "Kafka has answered",
    )
    _range_options(cap)
    cap.add_argument(
        "--timeout",
        type=seconds_up_to(3600),
        default=10.0,
        help="broker answer timeout, s (above 0, at most 3600)",
    )
    cap.add_argument(
        "--idle-timeout",
        type=seconds_up_to(86_400),
        default=30.0,
        help="give up after this long without data, s (above 0, at most 86400)",
    )
    cap.add_argument("--quiet", action="store_true", help="no progress bar")
    cap.add_argument("--force", action="store_true", help="replace an existing output file")
    cap.set_defaults(handler=cmd_capture)
    uses(cap, why="it reads the topic given as its argument, in no consumer group")

    rep = sub.add_parser(
        "replay", help="re-produce a capture file (or a live topic range) into a topic"
    )
    rep.add_argument("source", nargs="?", help="capture file (or use --from-topic)")
    rep.add_argument("--from-topic", help="replay a live range of this topic instead of a file")
    rep.add_argument(
        "--to", required=True, help="target topic (must exist, or pass --create-topic)"
    )
    rep.add_argument(
        "--into-ingested-topic",
        action="store_true",
        help="allow --to to be the topic ackline ingests (ACKLINE_TOPIC), e.g. to "
        "reprocess dead letters",
    )
    rep.add_argument(
        "--create-topic",
        action="store_true",
        help="create the target topic when missing (partitions: --partitions, else as "
        "many as the source's highest partition needs; max.message.bytes: room for the "
        "file's largest record, or the source topic's)",
    )
    rep.add_argument(
        "--partitions",
        dest="target_partitions",
        type=whole_from(1),
        help="only with --create-topic (refused without it): the new topic's partition count",
    )
    rep.add_argument(
        "--pace",
        default="max",
        help="original | <factor>x (2x, 0.5x) | <n>/s (5000/s) | max (default)",
    )
    rep.add_argument("--keep-timestamps", action="store_true", help="send the captured timestamps")
    _range_options(rep)
    rep.add_argument("--quiet", action="store_true", help="no progress bar")
    rep.set_defaults(handler=cmd_replay)
    uses(rep, "topic", why="it joins no consumer group")  # topic: --to must not be it
