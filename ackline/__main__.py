"""`python -m ackline`, and the `ackline` command's entry point.

A Ctrl-C before the CLI has its handlers (while its modules import, ~0.5 s of the
start) ends it with 130 and no traceback, as one a moment later does
(:func:`ackline.cli.main`); a stop after the command returned leaves its status alone."""

import signal
import sys
from types import FrameType

from ackline.core import early


def launch() -> int:
    # SIGTERM outside the command's own handling (before it, and after it, when
    # ackline.cli puts back the handler it found): a clean exit 143 before the command
    # ran, nothing once its work is over (its status decided); its default killed the
    # process, so a stop in the moments after a `dispatch --once` printed its summary
    # made the finished run look cut short (-15: 143 to a shell)
    signal.signal(signal.SIGTERM, _outside)
    try:
        from ackline.cli import main
    except KeyboardInterrupt:
        return 130
    if early.stopped:  # it came inside an import: the stop stands
        return 143
    status = main()
    # the command is over, its status decided, while the interpreter exits (its threads
    # joined, its modules torn down: tens of ms)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return status


def _outside(signum: int, frame: FrameType | None) -> None:
    # No import here: the signal may land in the middle of the start's own imports, and
    # importing then met modules half made (a traceback, exit 1). A module not there yet
    # means no work is over.
    done_status = getattr(sys.modules.get("ackline.core.signals"), "done_status", None)
    if done_status is not None and done_status() is not None:
        return
    early.stopped.append(signum)
    if not _importing(frame):
        raise SystemExit(143)
    # inside the import machinery an exception is printed as "Exception ignored" (a
    # module lock's callback) or breaks a module half made: recorded, it is raised once
    # the import is over (launch, ackline.cli.main)


def _importing(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside Python's import machinery."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


if __name__ == "__main__":
    raise SystemExit(launch())
