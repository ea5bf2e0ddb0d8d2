"""Output files checked before the work that fills them.

A manifest or a capture file is written to ``<path>.partial`` and renamed at the end;
:func:`check_target` makes sure, before a single record is produced or read, that the
rename and the writes will work: the path is not a directory, its folder can be made
and written, and an existing file is replaced only when asked to.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from ackline.load.errors import LoadError


class TargetError(LoadError):
    """An output path cannot be used; the message names it and the fix."""


def check_target(path: Path, *, what: str, overwrite: bool, force_hint: str = "") -> None:
    """Raise TargetError unless ``path`` can be written and renamed into place.

    ``what`` names the file in the message (``manifest``, ``capture file``);
    ``force_hint`` says how to allow replacing an existing file (e.g. ``pass --force``).
    Creates the missing parent folders (as the writer would) and nothing else: the probe
    file is removed at once.
    """
    path = Path(path)
    if path.is_dir():
        raise TargetError(f"{what} {path} is a directory: give a file path")
    if path.exists() and not overwrite:
        hint = f"; {force_hint}" if force_hint else ""
        raise TargetError(f"{what} {path} exists (from an earlier run?): choose another path{hint}")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=f".{path.name}.probe-"):
            pass
    except OSError as exc:
        raise TargetError(f"cannot write {what} {path}: {_problem(exc)}") from exc


def _problem(exc: OSError) -> str:
    text = os.strerror(exc.errno).lower() if exc.errno is not None else str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{text} (choose a writable place, or fix its permissions)"
    if exc.errno == errno.ENOTDIR:
        return f"{text} (a part of the path is a file)"
    return text
