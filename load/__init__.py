"""Load generation and verification: realistic agent activity with every fault kind.

* :mod:`.generate` plans the records (pure, seeded);
* :mod:`.produce` sends the plan to Kafka in transactions and writes the manifest;
* :mod:`.manifest` is the ground truth file (JSON lines, gzip when ``.gz``);
* :mod:`.verify` compares the manifest with what landed in PostgreSQL;
* :mod:`.capture.file` is the capture file format, :mod:`.capture.topics` reads a topic range
  (``ackline capture``) and :mod:`.capture.replay` re-produces it at a pace (``ackline replay``);
* :mod:`.bench` is ``make bench``: ackline beside the COPY limit and three peers.
"""
