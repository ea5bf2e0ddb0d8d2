"""Errors of the load stage (generator, producer driver, manifest, verifier)."""

from __future__ import annotations

from ackline.core.errors import AcklineError


class LoadError(AcklineError):
    """A load run cannot be planned, produced, recorded or verified."""
