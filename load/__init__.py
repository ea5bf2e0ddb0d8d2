"""Load generation and verification: realistic agent activity with every fault kind.

* :mod:`load.generate` plans the records (pure, seeded);
* :mod:`load.produce` sends the plan to Kafka in transactions and writes the manifest;
* :mod:`load.manifest` is the ground truth file (JSON lines, gzip when ``.gz``);
* :mod:`load.verify` compares the manifest with what landed in PostgreSQL.
"""
