"""Load generation and verification: realistic agent activity with every fault kind.

* :mod:`load.generate` plans the records (pure, seeded);
* :mod:`load.produce` sends the plan to Kafka in transactions and writes the manifest;
* :mod:`load.manifest` is the ground truth file (JSON lines, gzip when ``.gz``);
* :mod:`load.verify` compares the manifest with what landed in PostgreSQL;
* :mod:`load.capture` is the capture file format, :mod:`load.topics` reads a topic range
  (``ackline capture``) and :mod:`load.replay` re-produces it at a pace (``ackline replay``);
* :mod:`load.bench` is ``make bench``: ackline beside the COPY limit and three peers.
"""
