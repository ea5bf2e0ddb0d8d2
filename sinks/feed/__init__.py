"""sinks.feed."""
