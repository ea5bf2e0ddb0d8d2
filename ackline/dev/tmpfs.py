"""A small filesystem that fills up: a size-limited tmpfs, for disk-full tests and chaos.

    fs = Tmpfs(Path(".../ts/a"), owner="ackline-pg")
    fs.mount(size_bytes=1 << 30)
    fs.resize(fs.used() + 4 << 20)   # 4 MiB left: the next writes fail with ENOSPC
    fs.resize(1 << 30)               # room again; nothing restarts
    fs.unmount()

``mount -t tmpfs`` needs root. The filesystem's root directory is owned by ``owner``
with mode 0700, and ``path/"pg"`` is an empty directory of the same owner (PostgreSQL
insists on owning a tablespace's directory, and refuses a mount point as one). A remount
changes the size at once; a size below what is used is refused by the kernel, so
:meth:`Tmpfs.resize` never goes below ``used()``. Content lives in memory (and swap), only
as much as is written.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ackline.dev.errors import DevStackError
from ackline.dev.osuser import ensure_system_user

PAGE = 4096


def mounted(path: Path) -> bool:
    """Whether something is mounted exactly at ``path``."""
    target = str(Path(path).absolute())
    try:
        with open("/proc/self/mounts", encoding="utf-8") as fh:
            return any(line.split()[1] == target for line in fh if line.strip())
    except OSError:
        return False


class Tmpfs:
    """A tmpfs mounted at ``path``; ``dir`` is the owned subdirectory to use."""

    def __init__(self, path: Path, owner: str) -> None:
        self.path = Path(path).absolute()
        self.owner = owner

    @property
    def dir(self) -> Path:
        return self.path / "pg"

    def _run(self, *argv: str) -> None:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DevStackError(f"`{' '.join(argv)}` failed: {exc}") from exc
        if proc.returncode != 0:
            raise DevStackError(f"`{' '.join(argv)}` failed: {proc.stderr.strip()}")

    def mount(self, size_bytes: int) -> None:
        """Mount (unless mounted already) and make ``dir``; needs root."""
        if os.geteuid() != 0:
            raise DevStackError("a size-limited tmpfs needs root (mount -t tmpfs)")
        uid, gid = ensure_system_user(self.owner)
        if not mounted(self.path):
            self.path.mkdir(parents=True, exist_ok=True)
            opts = f"size={_pages(size_bytes)},uid={uid},gid={gid},mode=0700"
            self._run("mount", "-t", "tmpfs", "-o", opts, "ackline-tmpfs", str(self.path))
        self.dir.mkdir(exist_ok=True)
        os.chown(self.dir, uid, gid)
        self.dir.chmod(0o700)

    def usage(self) -> tuple[int, int]:
        """(used, total) bytes."""
        st = os.statvfs(self.path)
        return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize

    def used(self) -> int:
        return self.usage()[0]

    def free(self) -> int:
        used, total = self.usage()
        return total - used

    def resize(self, size_bytes: int) -> int:
        """Remount with ``size_bytes`` (at least what is used); returns the new size."""
        size = max(_pages(size_bytes), _pages(self.used()))
        self._run("mount", "-o", f"remount,size={size}", str(self.path))
        return size

    def unmount(self) -> None:
        """Unmount (lazily if still busy); nothing happens when it is not mounted."""
        if not mounted(self.path):
            return
        try:
            self._run("umount", str(self.path))
        except DevStackError:
            self._run("umount", "-l", str(self.path))


def _pages(size: int) -> int:
    return max(PAGE, -(-int(size) // PAGE) * PAGE)


__all__ = ["Tmpfs", "mounted"]
