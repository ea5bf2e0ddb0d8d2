"""sinks.ingest."""
