"""One module per `ackline` subcommand group; each exposes ``register(subparsers)``.

A handler takes ``(args, settings)`` and returns the exit status. Modules import their
heavy dependencies inside the handler so `ackline --help` and `ackline dev` stay fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ackline.settings import Settings

Handler = Callable[[argparse.Namespace, Settings], int]
Subparsers = Any  # argparse's _SubParsersAction is private

MODULES = (
    *("core", "dev", "feed", "config", "inspect", "doctor", "roles", "capture", "chaos"),
    "processors",
    "retention",
    "erase",
)
