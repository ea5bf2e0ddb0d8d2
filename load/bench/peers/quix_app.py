"""Peer (c): Quix Streams with its PostgreSQLSink, ON CONFLICT DO NOTHING.

Run by the bench in the peers' own virtualenv (``.ackline/bench/peers-venv``), never by
ackline. Settings come from the environment the bench sets. Quix's defaults are kept
(at-least-once, 5 s commit interval, librdkafka defaults) except: start from the
earliest offset, the table already exists (``schema_auto_update=False``: the bench
created it with the same columns and indexes as ackline's), and duplicates are ignored
with ``on_conflict_do_nothing=True``.
"""

from __future__ import annotations

import os

from quixstreams import Application
from quixstreams.sinks.community.postgresql import PostgreSQLSink


def main() -> None:
    env = os.environ
    app = Application(
        broker_address=env["BENCH_BOOTSTRAP"],
        consumer_group=env["BENCH_GROUP"],
        auto_offset_reset="earliest",
        use_changelog_topics=False,  # no state is used
    )
    sink = PostgreSQLSink(
        host=env["BENCH_PG_HOST"],
        port=int(env["BENCH_PG_PORT"]),
        dbname=env["BENCH_PG_DB"],
        user=env["BENCH_PG_USER"],
        password="",
        table_name=env["BENCH_TABLE"],
        schema_auto_update=False,
        on_conflict_do_nothing=True,
    )
    sdf = app.dataframe(app.topic(env["BENCH_TOPIC"], value_deserializer="json"))
    sdf.sink(sink)
    app.run()


if __name__ == "__main__":
    main()
