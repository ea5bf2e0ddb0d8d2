"""The unprivileged system user the dev stack's PostgreSQL runs as when we are root.

PostgreSQL refuses to run as root, and a tablespace's tmpfs must belong to the same user,
so whichever comes first on a fresh machine (the server or a disk-full tmpfs) creates it.
"""

from __future__ import annotations

import pwd
import shutil
import subprocess

from ackline.dev import _proc
from ackline.dev.errors import DevStackError


def ensure_system_user(name: str) -> tuple[int, int]:
    """(uid, gid) of ``name``, created first (system user, own group, no home) if missing."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        argv = [
            useradd,
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            "--comment",
            "ackline dev PostgreSQL",
            name,
        ]
        try:
            stderr = _proc.run(argv, timeout=60).stderr.strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            stderr = str(exc)
        try:
            entry = pwd.getpwnam(name)
        except KeyError as exc:
            raise DevStackError(
                f"could not create the system user {name!r} that runs PostgreSQL "
                f"(PostgreSQL refuses to run as root): {stderr}"
            ) from exc
    return entry.pw_uid, entry.pw_gid
