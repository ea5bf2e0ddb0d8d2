"""The Kafka side: consumer runtime, rebalance handling, producer SDK, dead letters."""
