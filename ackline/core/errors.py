"""The one root of ackline's own exceptions.

Each stage (``schemas``, ``streams``, ``sinks``, ``load``, the dev stack) defines its
errors in its own ``errors`` module as subclasses of :class:`AcklineError`, and wraps
the errors of its client library (confluent-kafka, asyncpg) at its boundary with
``raise StageError(...) from exc``.
"""

from __future__ import annotations


class AcklineError(Exception):
    """Root of every error ackline raises on purpose."""


class SettingsError(AcklineError):
    """A setting is missing or invalid; the message names the setting."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"setting {setting}: {problem}")
        self.setting = setting
        self.problem = problem
