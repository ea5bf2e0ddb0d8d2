"""A stop that came before the command could take it (ackline.__main__ records it):
raised where that is safe, not inside the import it landed in."""

from __future__ import annotations

stopped: list[int] = []
"""The signals that asked for a stop before the command's own handling began."""
