"""_owner.logger_process: what the owner does when the logger is not there to answer. A real
start and close are in tests/processes; these use stand-in processes (sleep, true)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from wandb_funnel._options import FunnelOptions, Topology
from wandb_funnel._owner.logger_process import LoggerProcess
from wandb_funnel._protocol.messages import LoggerStart
from wandb_funnel.errors import LoggerStartError

START = LoggerStart(
    "ipc:///nonexistent/s", None, "tok", os.getpid(), -1, FunnelOptions(), Topology(), {"id": "abc"}
)


def test_close_of_a_logger_that_already_exited_says_so_at_once() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    logger = LoggerProcess(START, proc)
    t0 = time.monotonic()
    assert logger.close(0, time.monotonic() + 30) == ("already-exited", None)
    assert time.monotonic() - t0 < 1.0


def test_kill_escalates_to_sigkill_for_a_logger_that_ignores_sigterm() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('ready', flush=True); time.sleep(60)"
            ),
        ],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    t0 = time.monotonic()
    LoggerProcess(START, proc).kill(grace=0.3)
    assert proc.returncode == -signal.SIGKILL
    assert time.monotonic() - t0 < 5.0
    proc.stdout.close()


def test_a_logger_that_exits_before_the_run_is_open_is_a_start_error() -> None:
    ready_r, ready_w = os.pipe()
    os.close(ready_w)  # what a logger that died leaves: a pipe at EOF
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(LoggerStartError, match=r"exited \(code 3\) before opening the run"):
        LoggerProcess(START, proc)._wait_ready(ready_r, 10.0)
    os.close(ready_r)
