"""`ackline offsets adopt-topic`: move a group's DB offsets to a new incarnation of its topic.

A topic deleted and made again under its name has a new topic ID, and the workers refuse
to start on it while the group's DB offsets belong to the old one (docs/guarantees.md, "A
recreated topic"). Adopting rewinds those offsets to 0 (their epochs bumped) and records
the new ID, so the next worker ingests the new topic from its log start. Connects with
the operator's DSN (the ingest role may not record another ID) and to Kafka for the
topic's ID.
"""

from __future__ import annotations

import argparse
import json

from ackline import endpoints
from ackline.commands import Subparsers, uses
from ackline.commands.guard import on_database
from ackline.core.errors import AcklineError
from ackline.core.signals import run_stoppable
from ackline.settings import Settings


def cmd_adopt_topic(args: argparse.Namespace, settings: Settings) -> int:
    """Read the topic's ID from Kafka; then, unless it is already the one recorded, rewind
    the group's DB offsets for the topic and record it, in one transaction
    (:func:`ackline.sinks.ingest.incarnation.adopt`, which says what a crash at each step
    leaves). Run with the group's workers stopped."""
    import asyncpg

    from ackline.clients import kafka_client_config
    from ackline.sinks.ingest import incarnation
    from ackline.status import groups_with_offsets
    from ackline.streams.kafkainfo import topic_incarnation

    bootstrap, _ = endpoints.endpoints(settings)  # both named first: a missing one says so at once
    topic, group = settings.topic, settings.group_id
    found = topic_incarnation(bootstrap, kafka_client_config(settings), topic)
    if found is None:
        raise AcklineError(
            f"Kafka at {bootstrap} gives no topic ID for {topic} (no such topic, or a broker "
            "that keeps none): nothing to adopt"
        )
    current, partitions = found

    async def adopt(conn: asyncpg.Connection) -> incarnation.Adopted | None:
        try:
            return await incarnation.adopt(conn, group, topic, current, partitions)
        except incarnation.NothingToAdoptError as exc:  # name the groups that have some
            others = await groups_with_offsets(conn, topic)
            named = ", ".join(others) if others else "none"
            raise AcklineError(f"{exc}; groups with DB offsets for {topic}: {named}") from exc

    adopted = run_stoppable(on_database(settings, adopt))
    if args.json:
        print(
            json.dumps(
                {
                    "topic": topic,
                    "group_id": group,
                    "topic_id": current,
                    "adopted": adopted is not None,
                    "previous_topic_id": adopted.previous if adopted else current,
                    "rewound_offsets": (
                        {str(p): o for p, o in sorted(adopted.offsets.items())} if adopted else {}
                    ),
                    "started_partitions": list(adopted.started) if adopted else [],
                }
            )
        )
    elif adopted is None:
        print(f"group {group} already follows topic {topic} {current}: nothing changed")
    else:
        rewound = ", ".join(f"{p}:{o}" for p, o in sorted(adopted.offsets.items())) or "none"
        started = (
            f"; partitions {', '.join(map(str, adopted.started))} (new) start at 0"
            if adopted.started
            else ""
        )
        print(
            f"group {group} now follows topic {topic} {current} (was "
            f"{adopted.previous or 'not recorded'}); its DB offsets (partition:next) "
            f"{rewound} rewound to 0, epochs bumped{started}: the next worker reads the new "
            "topic from its log start"
        )
    return 0


def register(sub: Subparsers) -> None:
    p = sub.add_parser("offsets", help="the group's DB offsets: adopt a recreated topic")
    actions = p.add_subparsers(dest="action", required=True)
    adopt = actions.add_parser(
        "adopt-topic",
        help="after the topic was deleted and made again: rewind the group's DB offsets for "
        "it to 0 and record its new topic ID, so workers start it from its log start",
        description="Workers refuse to start when the topic's ID (a new one each time the "
        "topic is made) is not the one the group's DB offsets belong to. Stop the group's "
        "workers, then run this: in one transaction it rewinds the group's DB offsets for the "
        "topic to 0 (their epochs bumped), stores 0 for partitions the group has none for, "
        "and records the new ID. Rows already ingested "
        "stay; events seen again are duplicates as ever. Nothing changes when the ID is "
        "already the recorded one.",
    )
    adopt.add_argument("--json", action="store_true", help="one JSON object")
    adopt.set_defaults(handler=cmd_adopt_topic)
    uses(adopt, "topic", "group_id")
