"""Process identity: this process's pid without a system call, and whether another pid
(a logger, a rank) is still the same live process.

``os.getpid()`` costs about 0.3 us (glibc no longer caches it), and ``log()`` asks twice per
call whether its stream was inherited through fork. The answer only changes at fork, and
CPython's fork runs ``register_at_fork`` hooks in the child.
"""

from __future__ import annotations

import os

current = os.getpid()


def _refresh() -> None:
    global current
    current = os.getpid()


os.register_at_fork(after_in_child=_refresh)


def _stat_fields(pid: int) -> list[bytes] | None:
    """Fields 3.. of /proc/<pid>/stat (state first), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 2 (comm) may contain spaces and parentheses: split after its closing paren.
    return stat[stat.rfind(b")") + 2 :].split()


def pid_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to detect pid reuse."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None  # field 22 overall: starttime
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    """True while ``pid`` runs (a zombie counts as dead; a reused pid does not count)."""
    fields = _stat_fields(pid)
    if fields is None:
        if os.path.isdir("/proc/self"):
            return False
        try:  # no procfs: the portable, weaker check
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if not fields or fields[0] in (b"Z", b"X"):
        return False
    return start_time is None or pid_start_time(pid) in (None, start_time)
