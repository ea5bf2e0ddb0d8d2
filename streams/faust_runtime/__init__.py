"""ackline's sink inside a Faust agent: the faust-streaming runtime (``--runtime faust``).

faust-streaming (aiokafka underneath) decides on its own when a message is "acked" and
which offset to commit, and several of its paths can make an offset committable before
its event is written (docs/faust.md). This runtime keeps ackline's guarantees by
taking those decisions away from faust:

- :mod:`.ledger` (pure): what this worker owns, under which epoch and consumer
  generation, what PostgreSQL committed, and which records a batch may take;
- :mod:`.batching` (pure): records → one :class:`~ackline.sinks.ingest.batch.Batch` and its poison;
- :mod:`.transport`: the faust/aiokafka subclasses — read_committed fetching, acks that
  never move an offset, commits of the PostgreSQL offsets only, seeks to the PostgreSQL
  offsets after every assignment;
- :mod:`.sink`: the agent body — batch, dead-letter, write, then ack in order;
- :mod:`.app`: :func:`make_app`, the factory (no module-level app, no import-time effects);
- :mod:`.worker`: ``ackline run --runtime faust``.

Importing this package does not import faust; the modules that need it do.
"""
