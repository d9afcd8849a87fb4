"""Shared fixtures: a private WANDB_DIR per test, and scripts run as real owner processes
whose every descendant (logger, wandb-core, workers) must be gone when the test ends."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from wandb_funnel.soak import jobenv

MARK_VAR = "WANDB_FUNNEL_TEST_MARK"

# A shell that starts the suite in the background (`nohup ... &`) leaves SIGINT ignored, and
# an ignored signal survives exec: every scenario would then shrug off its Ctrl-C. A handler
# of ours is reset to the default at exec instead, as in an interactive run.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def leftover_processes(mark: str, grace: float = 5.0) -> list[str]:
    """Processes carrying ``mark`` still alive after ``grace`` seconds; all killed before return.

    wandb-core notices that its parent is gone on its own schedule, so give it a grace period.
    """
    return jobenv.leftover_processes(mark, MARK_VAR, grace)


@dataclass
class ScriptResult:
    returncode: int
    stdout: str
    stderr: str
    elapsed: float
    leftovers: list[str]


class Scripts:
    """Runs the programs of tests/programs (see ``program()``) as owner processes, with a
    deadline and a leftover check."""

    def __init__(self, tmp_path: pathlib.Path) -> None:
        self.tmp_path = tmp_path
        self.wandb_dir = tmp_path
        self.mark = uuid.uuid4().hex

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return jobenv.clean_environment(
            self.wandb_dir, self.tmp_path, mark=self.mark, mark_var=MARK_VAR,
            drop=("WANDB_",), extra=extra,
        )

    def start_file(
        self,
        path: pathlib.Path,
        args: list[str],
        extra_env: dict[str, str] | None = None,
        new_session: bool = True,
    ) -> subprocess.Popen[str]:
        """Start a program file (``tests/programs``, see ``program()``) as the owner process."""
        return subprocess.Popen(
            [sys.executable, str(path), *args],
            cwd=self.tmp_path,
            env=self.env(extra_env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=new_session,  # its own process group, for killpg tests
        )

    def run_file(
        self,
        path: pathlib.Path,
        args: list[str],
        timeout: float = 90,
        extra_env: dict[str, str] | None = None,
    ) -> ScriptResult:
        """Run a program file of the test tree (``tests/programs``) as the owner process."""
        t0 = time.monotonic()
        return self.finish(self.start_file(path, args, extra_env), timeout, t0)

    def finish(self, proc: subprocess.Popen[str], timeout: float, t0: float) -> ScriptResult:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            # Processes in other sessions (the logger, wandb-core) may hold the pipes open.
            leftovers = leftover_processes(self.mark, grace=0)
            try:
                out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                out, err = "", "(pipes still held open)"
            pytest.fail(
                f"scenario hung past {timeout}s\n--- stdout\n{out}\n--- stderr\n{err}\n"
                f"leftovers: {leftovers}"
            )
        elapsed = time.monotonic() - t0
        return ScriptResult(proc.returncode, out, err, elapsed, leftover_processes(self.mark))



@pytest.fixture
def scripts(tmp_path: pathlib.Path) -> Iterator[Scripts]:
    s = Scripts(tmp_path)
    yield s
    leftover_processes(s.mark, grace=0)  # never leave anything behind, even on failure


PROGRAMS = pathlib.Path(__file__).parent / "programs"


def program(name: str) -> pathlib.Path:
    """``tests/programs/<name>.py``: a program (linted and type-checked like the package) that
    a test runs as the owner process with ``Scripts.run_file`` / ``start_file``. Most take
    the scenario to run as their first argument and print what they saw as REPORT lines
    (``tests/programs/_prelude.py``), which ``reports`` / ``wait_for_report`` read."""
    path = PROGRAMS / f"{name}.py"
    assert path.is_file(), path
    return path


def reports(stdout: str) -> dict[str, Any]:
    """Merge every ``REPORT {json}`` line a scenario printed."""
    import json

    out: dict[str, Any] = {}
    for line in stdout.splitlines():
        if line.startswith("REPORT "):
            out.update(json.loads(line[len("REPORT ") :]))
    return out


def wait_for_report(
    proc: subprocess.Popen[str], key: str, timeout: float = 60
) -> dict[str, Any]:
    """Read the scenario's stdout until a REPORT carrying ``key`` arrives (bounded)."""
    import json
    import selectors

    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if not sel.select(timeout=0.2):
            if proc.poll() is not None:
                break
            continue
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("REPORT "):
            seen.update(json.loads(line[len("REPORT ") :]))
            if key in seen:
                return seen
    raise AssertionError(f"no REPORT with {key!r} within {timeout}s (got {seen})")
