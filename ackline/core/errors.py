"""The one root of ackline's own exceptions.

Each stage (``schemas``, ``streams``, ``sinks``, ``load``, the dev stack) defines its
errors in its own ``errors`` module as subclasses of :class:`AcklineError`, and wraps
the errors of its client library (confluent-kafka, asyncpg) at its boundary with
``raise StageError(...) from exc``.
"""

from __future__ import annotations

import signal


class AcklineError(Exception):
    """Root of every error ackline raises on purpose."""


class SettingsError(AcklineError):
    """A setting is missing or invalid; the message names the setting."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"setting {setting}: {problem}")
        self.setting = setting
        self.problem = problem


class Terminated(SystemExit):
    """SIGTERM arrived while a command ran; ``ackline.cli`` raises it. A stop, not an
    error, so not an AcklineError; here because every layer may meet it.

    A SystemExit, so neither ``except Exception`` cleanup paths nor asyncio swallow it:
    asyncio logs and drops any other BaseException a callback or a transport's write
    raises, and a command cut there ran on to its end. Escaping ``main``, it exits 143."""

    def __init__(self, code: int = 128 + signal.SIGTERM) -> None:
        super().__init__(code)  # the code as an argument: copies and pickles rebuild it
