"""ackline: exactly-once ingest of agent activity from Kafka into PostgreSQL.

This package is the thin composition root: settings, CLI, metrics and the local
development stack. The stages live in the top-level packages ``schemas``,
``streams``, ``sinks`` and ``load``.
"""

__version__ = "0.1.0"
