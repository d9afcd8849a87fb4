"""A job's private environment, and finding the job's processes again by a marker in it.

Used by the soak harness, the test suite (``tests/conftest.py``) and the benchmarks
(``benchmarks/_common.py``): one place that says what a clean offline job looks like.

- ``clean_environment``: the parent's environment without inherited ``WANDB_*`` (and, by
  default, ``TORCHELASTIC*``) variables, with offline wandb writing into a private
  ``WANDB_DIR``, a private ``TMPDIR`` (the logger's IPC socket lives there) and, optionally, a
  marker variable. Every process the job starts (the logger, wandb-core, workers, torchrun
  ranks) inherits the marker.
- ``marked_processes``: the running processes that carry a marker (read from
  ``/proc/<pid>/environ`` through psutil), so a job's processes can be found whoever their
  parent is: the logger and wandb-core run in sessions of their own.
- ``leftover_processes``: the marked processes still alive after a grace period, killed.

psutil is imported only by the functions that scan processes: ``clean_environment`` works
without it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

MARK_VAR = "WANDB_FUNNEL_SOAK_MARK"
# Inherited variables that would steer the job elsewhere: a parent's wandb settings or run,
# a parent funnel's WANDB_FUNNEL_* (the logger to attach to), a launcher's TORCHELASTIC_*.
DROP_PREFIXES = ("WANDB_", "_WANDB_", "TORCHELASTIC")


def clean_environment(
    wandb_dir: os.PathLike[str] | str,
    tmpdir: os.PathLike[str] | str | None = None,
    *,
    mark: str | None = None,
    mark_var: str = MARK_VAR,
    drop: tuple[str, ...] = DROP_PREFIXES,
    unbuffered: bool = True,
    extra: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a job that runs wandb offline in private directories.

    ``base`` (default ``os.environ``) without the variables starting with any of ``drop``;
    then ``WANDB_MODE=offline``, ``WANDB_DIR=wandb_dir``, ``WANDB_SILENT=true``,
    ``TMPDIR=tmpdir`` (default: ``wandb_dir``; keep it short, a Unix socket path is at most
    107 bytes), ``PYTHONUNBUFFERED=1`` when ``unbuffered``, ``mark_var=mark`` when a mark is
    given, and last ``extra``.
    """
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if not k.startswith(drop)}
    env.update(
        {
            "WANDB_DIR": os.fspath(wandb_dir),
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "TMPDIR": os.fspath(wandb_dir if tmpdir is None else tmpdir),
        }
    )
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    if mark is not None:
        env[mark_var] = mark
    env.update(extra or {})
    return env


def marked_processes(
    mark: str, var: str = MARK_VAR, cache: dict[tuple[int, float], bool] | None = None
) -> list[psutil.Process]:
    """The running processes (not zombies, never this one) whose environment has
    ``var=mark``.

    Reading every process's environment is the expensive part: pass the same ``cache`` dict
    to repeated scans and each process (by pid and start time) is read once.
    """
    import psutil

    me = os.getpid()
    found = []
    # Fresh Process objects, not psutil.process_iter: its module-wide cache is copied when an
    # iteration starts and written back when it ends, so scans from several threads (the
    # harness's --jobs) can write back the object of a process that has since died. When
    # its pid comes round again (pid_max is 32768 here), the scan yields that stale object
    # for the new process, and psutil refuses to signal it ("PID reused"): the soak's scancel
    # then missed the owner and wandb-core of report-wandb9963 while reaching the rest.
    for pid in psutil.pids():
        if pid == me:
            continue
        try:
            proc = psutil.Process(pid)
            key = (pid, proc.create_time())
        except psutil.Error:
            continue  # gone meanwhile
        marked = cache.get(key) if cache is not None else None
        if marked is None:
            try:
                env = proc.environ()
            except (psutil.Error, OSError):
                continue  # gone, a zombie, or not ours to read: not one of the job's
            if not env:
                # Read mid-execve (or while exiting) an environment is empty for a moment:
                # unknown, not "unmarked", so it is read again by the next scan.
                continue
            marked = env.get(var) == mark
            if cache is not None:
                cache[key] = marked
        if marked:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except psutil.Error:
                pass
    return found


def describe(proc: psutil.Process, width: int = 120) -> str:
    """``pid command line`` (the command line cut at ``width`` characters)."""
    import psutil

    try:
        return f"{proc.pid} {' '.join(proc.cmdline())[:width]}"
    except psutil.Error:
        return str(proc.pid)


def leftover_processes(mark: str, var: str = MARK_VAR, grace: float = 5.0) -> list[str]:
    """Processes carrying ``var=mark`` still alive after ``grace`` seconds, described; all of
    them are killed before this returns.

    wandb-core notices that its parent is gone on its own schedule: give it a grace period.
    """
    import psutil

    deadline = time.monotonic() + grace
    while True:
        alive = marked_processes(mark, var)
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    described = []
    for proc in alive:
        try:
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            proc.kill()
        except psutil.Error:
            pass  # gone meanwhile (before its command line was read: not a leftover)
    return described
