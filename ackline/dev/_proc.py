"""Process helpers for detached services: pid files, liveness, signals, waiting."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path


def read_pid_file(path: Path) -> int | None:
    """The pid on the first line of ``path``, or None when absent or unreadable."""
    try:
        first = path.read_text(encoding="utf-8").splitlines()[0].strip()
        pid = int(first)
    except (OSError, IndexError, ValueError):
        return None
    return pid if pid > 0 else None


def write_pid_file(path: Path, pid: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{pid}\n", encoding="utf-8")
    tmp.replace(path)


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is our own exited child (else it stays a zombie)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def proc_state(pid: int) -> str | None:
    """The one-letter state from /proc/<pid>/stat, or None when there is no such pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError:
        return "?"
    # "pid (comm) S ..."; comm may contain spaces and parentheses.
    rest = stat[stat.rfind(")") + 2 :]
    return rest[:1] or "?"


def is_alive(pid: int) -> bool:
    """True when ``pid`` is a live process (zombies and dead pids are not)."""
    _reap(pid)
    if Path("/proc").is_dir():
        state = proc_state(pid)
        if state is None:
            return False
        if state not in ("Z", "X", "x"):
            return True
        # A zombie leader whose other threads are still exiting keeps its sockets and
        # files open until the last thread is gone: only then is the process dead.
        try:
            return len(os.listdir(f"/proc/{pid}/task")) > 1
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cmdline(pid: int) -> list[str]:
    """The argv of ``pid`` (empty when gone or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            if len(fields) > 1 and fields[1] == str(pid):
                found.append(int(entry.name))
    return found


def send(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to ``pid``, ignoring a process that is already gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def wait_gone(pids: Iterable[int], timeout: float) -> bool:
    """Wait until none of ``pids`` is alive; False when some still are at the deadline."""
    pending = set(pids)
    deadline = time.monotonic() + timeout
    while True:
        pending = {pid for pid in pending if is_alive(pid)}
        if not pending:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def tail(path: Path, lines: int = 30, start: int = 0) -> str:
    """The last ``lines`` lines of a text file after byte ``start`` ('' when none)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            if start > size:  # truncated or replaced meanwhile
                start = 0
            fh.seek(max(start, size - 64 * 1024))
            data = fh.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (flock) on ``path``, held for the ``with`` block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def find_processes(needles: Iterable[str]) -> list[int]:
    """Live pids whose argv contains every string of ``needles`` as an element."""
    wanted = list(needles)
    found: list[int] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            argv = cmdline(pid)
            if argv and all(n in argv for n in wanted) and is_alive(pid):
                found.append(pid)
    return found


def nice_session(pid: int, nice: int | None = None) -> None:
    """Run ``pid``'s session at ``nice`` (default: this process's own nice value).

    A detached service runs in a session of its own, and with the kernel's autogroup
    scheduling (``/proc/sys/kernel/sched_autogroup_enabled``) each session competes for
    the CPU as one group, whatever its processes' nice values: a stack started under
    ``nice`` would otherwise take its full share beside everything else. Nothing to do
    at nice 0; where the kernel has no autogroups, the process's own nice value, which
    it inherited, already applies.
    """
    value = os.getpriority(os.PRIO_PROCESS, 0) if nice is None else nice
    if value <= 0:
        return
    with contextlib.suppress(OSError):  # no autogroups, or the process is gone
        Path(f"/proc/{pid}/autogroup").write_text(str(value), encoding="ascii")


def run(
    argv: Sequence[str],
    *,
    timeout: float,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    new_session: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run a helper program to completion: no stdin, output captured as text, no check.

    Raises subprocess.TimeoutExpired (the program is killed) and OSError as run() does;
    callers turn both into DevStackError with what they were doing.
    """
    return subprocess.run(
        list(argv),
        cwd=cwd,
        env=None if env is None else dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=new_session,
        check=False,
    )
