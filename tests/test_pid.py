"""_pid: this process's pid without a system call, and whether another pid still runs."""

from __future__ import annotations

import os

from wandb_funnel import _pid

NO_SUCH_PID = 2**22 + 12345  # above Linux's largest pid_max


def test_current_is_this_process() -> None:
    assert _pid.current == os.getpid()


def test_this_process_is_alive_and_a_missing_pid_is_not() -> None:
    assert _pid.pid_alive(os.getpid())
    assert not _pid.pid_alive(NO_SUCH_PID)


def test_a_reused_pid_is_told_from_the_original_by_its_start_time() -> None:
    started = _pid.pid_start_time(os.getpid())
    assert isinstance(started, int) and started > 0
    assert _pid.pid_alive(os.getpid(), started)
    assert not _pid.pid_alive(os.getpid(), started + 1)  # same pid, another process
    assert _pid.pid_start_time(NO_SUCH_PID) is None
