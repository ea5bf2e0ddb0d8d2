"""The local real stack behind ``make demo``, ``make test`` and CI.

A single-node Kafka broker (KRaft combined mode, jars fetched once from Maven Central)
and a PostgreSQL server, both run as plain detached processes whose state lives in a
state directory (default ``.ackline`` in the current working directory). The entry
points are in :mod:`ackline.dev.stack`: ``up``, ``down``, ``status``, ``resolve``,
``restart_kafka`` and ``restart_postgres``.
"""
