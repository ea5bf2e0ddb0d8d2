"""Tasks abandoned on purpose: their outcome is taken so asyncio logs nothing of it."""

from __future__ import annotations

import asyncio
from typing import Any


def take_outcome(task: asyncio.Future[Any]) -> None:
    """A done callback for a task that is cancelled or left behind on purpose (a cut
    call, a claim given up): retrieve its exception, if any, so that asyncio does not log
    "Task exception was never retrieved" about news nobody waits for."""
    if not task.cancelled():
        task.exception()
