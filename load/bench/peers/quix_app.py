"""Peer (c): Quix Streams with its PostgreSQLSink, ON CONFLICT DO NOTHING.

Run by the bench in the peers' own virtualenv (``.ackline/bench/peers-venv``), never by
ackline. Settings come from the environment the bench sets. Its throughput settings, from
Quix's documentation (sinks, "Performance considerations"):

* a ``BatchingSink`` such as ``PostgreSQLSink`` writes what one checkpoint processed in one
  go, so the checkpoint is the batch: ``commit_interval`` stays at 5 s (the default; a
  shorter one means smaller batches) and ``commit_every=10_000`` caps a batch, as the docs
  advise ("if the batches become large enough, it can also put additional load on the
  destination and decrease the overall throughput"; uncapped, one 5 s checkpoint held
  50,000 rows and took the process to 712 MB);
* at-least-once processing (the default; exactly-once adds Kafka transactions);
* ``include_metadata=False``: no ``__key`` and ``timestamp`` columns, so the table has the
  same columns as the others and each row carries nothing extra.

Otherwise: start from the earliest offset, the table already exists
(``schema_auto_update=False``: the bench created it with the same columns and indexes as
ackline's), and duplicates are ignored with ``on_conflict_do_nothing=True``.
"""

from __future__ import annotations

import os

from quixstreams import Application
from quixstreams.sinks.community.postgresql import PostgreSQLSink

COMMIT_INTERVAL_S = 5.0
COMMIT_EVERY = 10_000


def main() -> None:
    env = os.environ
    app = Application(
        broker_address=env["BENCH_BOOTSTRAP"],
        consumer_group=env["BENCH_GROUP"],
        auto_offset_reset="earliest",
        use_changelog_topics=False,  # no state is used
        commit_interval=COMMIT_INTERVAL_S,
        commit_every=COMMIT_EVERY,
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
        include_metadata=False,
    )
    sdf = app.dataframe(app.topic(env["BENCH_TOPIC"], value_deserializer="json"))
    sdf.sink(sink)
    app.run()


if __name__ == "__main__":
    main()
