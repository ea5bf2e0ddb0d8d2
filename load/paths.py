"""Output files checked before the work that fills them.

A manifest or a capture file is written to ``<path>.partial`` and renamed at the end;
:func:`check_target` makes sure, before a single record is produced or read, that the
rename and the writes will work: the path is not a directory, its folder can be made
and written, and an existing file is replaced only when asked to. It makes no folder:
the writer makes the missing ones when it opens the file, once the brokers answered,
so a run refused before that leaves nothing behind.
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
    A probe file, removed at once, shows that the nearest existing folder can be written
    (the missing ones below it can then be made).
    """
    path = Path(path)
    if path.is_dir():
        raise TargetError(f"{what} {path} is a directory: give a file path")
    if path.exists() and not overwrite:
        hint = f"; {force_hint}" if force_hint else ""
        raise TargetError(f"{what} {path} exists (from an earlier run?): choose another path{hint}")
    try:
        folder = _nearest_existing(path.parent)
        if not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{path.name}.probe-"):
            pass
    except OSError as exc:
        raise TargetError(f"cannot write {what} {path}: {_problem(exc)}") from exc


def _nearest_existing(folder: Path) -> Path:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _problem(exc: OSError) -> str:
    text = os.strerror(exc.errno).lower() if exc.errno is not None else str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{text} (choose a writable place, or fix its permissions)"
    if exc.errno == errno.ENOTDIR:
        return f"{text} (a part of the path is a file)"
    return text
