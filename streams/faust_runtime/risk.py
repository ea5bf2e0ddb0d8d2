"""Named risks of the faust runtime, refused unless the operator accepts them by name.

``ACKLINE_FAUST_ACCEPT_RISK`` is a comma list of risk names. Today there is one:

- ``untested-faust-version``: the installed faust-streaming is outside the series this
  runtime was proven on (0.15.x), or one of the faust methods it overrides no longer
  exists there. The overrides (docs/faust.md) replace faust's ack, commit, gap,
  read-offset and seek paths; if faust renamed one, faust's own path would run again —
  the paths that commit past an in-flight message (#606) or seek to Kafka's offsets —
  or, for the fetch, the lag would count records in flight as done. It
  also names the stream methods the byte-bounded take calls, the app's queue factory, and
  the rebalance listener's assignment callback that numbers every assignment (without
  it faust's own would set Kafka's generation, which a lone rejoin repeats).
  Names only: a change of what they do, or of mode-streaming's queue internals that
  ByteBoundQueue relies on (every insert through ``_put``), goes unseen here.

Pure: the caller passes the version and the base classes.
"""

from __future__ import annotations

from ackline.core.errors import SettingsError

SETTING = "ACKLINE_FAUST_ACCEPT_RISK"
UNTESTED_VERSION = "untested-faust-version"
KNOWN = frozenset({UNTESTED_VERSION})
PROVEN_SERIES = (0, 15)

CONSUMER_OVERRIDES = (
    "ack",
    "_add_gap",
    "_filter_tps_with_pending_acks",
    "_filter_committable_offsets",
    "_commit_offsets",
    "seek_to_committed",
    "on_partitions_revoked",
    "on_partitions_assigned",
    "resume_flow",
    "_new_consumer_thread",
    "RebalanceListener",
)
# The thread methods overridden, then those AcklineRebalanceListener calls on the thread.
THREAD_OVERRIDES = ("_create_worker_consumer", "_commit", "on_start", "_fetch_records")
THREAD_USES = ("on_partitions_assigned", "_ensure_consumer")
LISTENER_OVERRIDES = ("on_partitions_assigned",)
# The byte-bounded take (bytebound.take_batches) drives the stream by these, as faust's
# noack_take does; the app's channel queues are made by FlowControlQueue, which AcklineApp
# replaces with a byte-bounded one. Renamed, the take would fail, or the bound be lost.
STREAM_USES = ("_enable_passive", "add_processor", "wait", "wait_for_stopped")
APP_OVERRIDES = ("FlowControlQueue",)


def accepted(spec: str) -> set[str]:
    """The risk names in ``spec``; a name that is not a known risk is a SettingsError."""
    names = {part.strip() for part in spec.split(",") if part.strip()}
    unknown = sorted(names - KNOWN)
    if unknown:
        raise SettingsError(SETTING, f"unknown risk {unknown[0]!r} (known: {sorted(KNOWN)})")
    return names


def version_problems(
    version: str,
    consumer_base: type,
    thread_base: type,
    stream_base: type,
    app_base: type,
    listener_base: type,
) -> list[str]:
    """Why the installed faust is not the one this runtime was proven on ([]: it is)."""
    problems = []
    parts = version.split(".")
    try:
        series = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        series = (-1, -1)
    if series != PROVEN_SERIES:
        problems.append(f"faust-streaming {version} is not {PROVEN_SERIES[0]}.{PROVEN_SERIES[1]}.x")
    for base, names in (
        (consumer_base, CONSUMER_OVERRIDES),
        (thread_base, THREAD_OVERRIDES + THREAD_USES),
        (stream_base, STREAM_USES),
        (app_base, APP_OVERRIDES),
        (listener_base, LISTENER_OVERRIDES),
    ):
        for name in names:
            if not callable(getattr(base, name, None)):
                problems.append(f"{base.__name__}.{name} no longer exists")
    return problems


def check(problems: list[str], spec: str) -> None:
    """Refuse to start on ``problems`` unless ``untested-faust-version`` is accepted."""
    names = accepted(spec)
    if problems and UNTESTED_VERSION not in names:
        raise SettingsError(
            SETTING,
            f"refusing to start: {'; '.join(problems)}. Set {SETTING}={UNTESTED_VERSION} "
            "to run anyway (docs/faust.md)",
        )
