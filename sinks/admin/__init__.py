"""sinks.admin."""
