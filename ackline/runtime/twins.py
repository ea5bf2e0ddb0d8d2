"""One name, one process: a worker refuses to join a group where its worker id is taken.

Two `ackline run` processes with one ``ACKLINE_WORKER_ID`` keep exactly once: Kafka
tells them apart by member id, each claim bumps the epoch, and the fence compares epochs,
never names (docs/design.md, "Fencing and epochs"). But nothing else can tell them
apart: the owner of every offset row, the worker of every batch row, `ackline status`,
the Kafka client.id and the PostgreSQL application_name all carry the one name, so an
operator cannot see which process holds what, nor that there are two. The group's
members say it: ackline sets each consumer's client.id to its worker id.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from ackline.clients import kafka_client_config
from ackline.core.errors import SettingsError
from ackline.settings import Settings
from ackline.streams.errors import KafkaUnavailableError
from ackline.streams.kafkainfo import GroupMember, group_members

log = logging.getLogger(__name__)

CONSUMER_SESSION_S = 60.0
"""The longest session a broker allows under the ``consumer`` protocol by default
(``group.consumer.max.session.timeout.ms``; the broker's own default session is 45 s):
the session is the broker's there, and the worker cannot read it."""
LOOK_EVERY_S = 1.0


def namesakes(members: Sequence[GroupMember], worker_id: str) -> list[GroupMember]:
    """The members that carry ``worker_id`` as their client.id. Pure."""
    return [m for m in members if m.client_id == worker_id]


def named_by_operator(settings: Settings) -> bool:
    """Whether the worker id was set (ACKLINE_WORKER_ID), not the default. Pure."""
    return "worker_id" in settings.model_fields_set


def leave_bound_s(settings: Settings) -> float:
    """How long a dead member stays in the group: its session timeout, and a margin.
    A predecessor killed just before this start is still a member until then."""
    session_s = (
        settings.session_timeout_ms / 1000
        if settings.group_protocol == "classic"
        else CONSUMER_SESSION_S
    )
    return session_s + 5.0


async def refuse_a_namesake(
    settings: Settings, bootstrap: str, stopped: Callable[[], bool]
) -> None:
    """Raise SettingsError (naming ACKLINE_WORKER_ID) when a live member of the group
    already carries this worker's id; return when none does, once ``stopped()``, or when
    the group cannot be described (a WARNING: the check is skipped, nothing else
    depends on it).

    Order of effects: it only reads (describes the group, as `ackline status` does), and
    runs before the worker joins, claims or writes anything: a crash or a refusal at
    any step leaves nothing behind, and the worker that holds the name goes on.

    The default id (``<hostname>-<pid>``) taken is a WARNING, not a refusal: containers
    sharing a host name all run as pid 1, and a refusal would loop them through restarts.

    A namesake may be this worker's own predecessor, killed a moment ago: the group
    keeps it until its session times out. So a namesake seen is looked at again every
    second until :func:`leave_bound_s`, and only one still there is refused (a stopped
    process's membership has expired by then; a stopped process is fenced as ever).
    """
    conf = kafka_client_config(settings)
    me, group = settings.worker_id, settings.group_id

    async def look() -> list[GroupMember] | None:
        try:
            members = await asyncio.to_thread(group_members, bootstrap, conf, group, 5.0)
        except KafkaUnavailableError as exc:
            log.warning("cannot tell whether worker id %s is taken in group %s: %s", me, group, exc)
            return None
        return namesakes(members, me)

    seen = await look()
    if not seen:
        return
    if not named_by_operator(settings):
        # the default (<hostname>-<pid>) is not unique where containers share a host name
        # (host networking, a fixed hostname) and all run as pid 1: those kept exactly
        # once before this check, and a refusal would loop them through restarts
        log.warning(
            "group %s already has a member named %s (host %s), this worker's default id: "
            "set a distinct ACKLINE_WORKER_ID for each worker, or the two cannot be told "
            "apart (offset owners, batch rows, ackline status); joining",
            group,
            me,
            seen[0].host,
        )
        return
    bound = leave_bound_s(settings)
    log.warning(
        "group %s already has a member named %s (host %s): waiting up to %.0f s for it to "
        "leave (a predecessor that just ended) before joining",
        group,
        me,
        seen[0].host,
        bound,
    )
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        await asyncio.sleep(LOOK_EVERY_S)
        if stopped():
            return
        seen = await look()
        if seen is None:
            return  # the group cannot be described now (warned): the check is skipped
        if not seen:
            log.info("the member named %s left group %s: joining", me, group)
            return
    raise SettingsError(
        "ACKLINE_WORKER_ID",
        f"{me!r} is taken: a live worker of group {group} (host {seen[0].host}) has that "
        f"name, still there after {bound:.0f} s. Two workers of one name keep exactly once "
        "(the epoch fence) but nothing can tell them apart: offset owners, batch rows, "
        "ackline status, the client.id and application_name. Give each worker its own "
        "ACKLINE_WORKER_ID",
    )
