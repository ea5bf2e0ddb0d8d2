"""The top of the house: how an ingest worker is composed and run.

:mod:`.wiring` builds the parts every ingest worker needs (:func:`.wiring.build_ingest`);
:mod:`.confluent` runs the default runtime and :mod:`.faust_app`/:mod:`.faust_worker` the
faust one on the same parts; :mod:`.health` and :mod:`.httpserver` serve /metrics,
/healthz and /readyz. Nothing here reaches the dev stack: the shell resolves where the
services are and passes them in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ackline.core.errors import SettingsError
from ackline.settings import Settings

if TYPE_CHECKING:
    from ackline.sinks.ingest.incarnation import Confirmed

BeforeJoin = Callable[[Callable[[], bool]], Awaitable["Confirmed | None"]]
"""What a worker awaits after its topic checks and before it joins the consumer group,
given a ``stopped()`` to return early on (`ackline run`: wait for PostgreSQL, check the
topic's incarnation). It returns the topic ID it confirmed as the one the group's DB
offsets belong to, if it did: the running watch starts from it."""


def run(
    settings: Settings,
    bootstrap: str,
    dsn: str,
    runtime: str | None = None,
    until_drained: bool = False,
    before_join: BeforeJoin | None = None,
) -> int:
    """`ackline run`: the runtime of ``runtime`` (else ``settings.runtime``); the status.

    The faust runtime refuses to start when faust-streaming is not installed (the
    ``[faust]`` extra) or when a named risk is not accepted.
    """
    if (runtime or settings.runtime) == "faust":
        try:
            from ackline.runtime.faust_worker import run as run_faust
        except ImportError as exc:
            raise SettingsError(
                "ACKLINE_RUNTIME",
                f"faust needs the [faust] extra (pip install 'ackline[faust]'): {exc}",
            ) from exc
        return run_faust(
            settings, bootstrap, dsn, until_drained=until_drained, before_join=before_join
        )
    from ackline.runtime.confluent import run as run_confluent

    # Ctrl-C twice exits at once: nothing of `ackline run` is left to clean up
    return asyncio.run(
        run_confluent(
            settings,
            bootstrap,
            dsn,
            until_drained=until_drained,
            exit_on_repeat=True,
            before_join=before_join,
        )
    )
