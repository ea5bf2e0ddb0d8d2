"""ackline.core."""
