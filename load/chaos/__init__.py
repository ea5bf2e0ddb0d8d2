"""ackline.load.chaos.harness."""
