"""ackline.load.capture.file."""
