"""Shared fixtures: a private WANDB_DIR per test, and scripts run as real owner processes
whose every descendant (logger, wandb-core, workers) must be gone when the test ends."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest

MARK_VAR = "WANDB_FUNNEL_TEST_MARK"

# A shell that starts the suite in the background (`nohup ... &`) leaves SIGINT ignored, and
# an ignored signal survives exec: every scenario would then shrug off its Ctrl-C. A handler
# of ours is reset to the default at exec instead, as in an interactive run.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _marked(mark: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get(MARK_VAR) == mark:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def leftover_processes(mark: str, grace: float = 5.0) -> list[str]:
    """Processes carrying ``mark`` still alive after ``grace`` seconds; all killed before return.

    wandb-core notices that its parent is gone on its own schedule, so give it a grace period.
    """
    deadline = time.monotonic() + grace
    while True:
        alive = [p for p in _marked(mark) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    described = []
    for proc in alive:
        try:
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            proc.kill()
        except psutil.Error:
            pass
    return described


@dataclass
class ScriptResult:
    returncode: int
    stdout: str
    stderr: str
    elapsed: float
    leftovers: list[str]


class Scripts:
    """Runs Python snippets as owner processes, with a deadline and a leftover check."""

    def __init__(self, tmp_path: pathlib.Path) -> None:
        self.tmp_path = tmp_path
        self.wandb_dir = tmp_path
        self.mark = uuid.uuid4().hex
        self._count = 0

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
        env.update(
            {
                "WANDB_DIR": str(self.wandb_dir),
                "WANDB_MODE": "offline",
                "WANDB_SILENT": "true",
                "PYTHONUNBUFFERED": "1",
                MARK_VAR: self.mark,
                "TMPDIR": str(self.tmp_path),
            }
        )
        env.update(extra or {})
        return env

    def write(self, code: str) -> pathlib.Path:
        self._count += 1
        path = self.tmp_path / f"scenario_{self._count}.py"
        path.write_text(textwrap.dedent(code))
        return path

    def start(
        self, code: str, extra_env: dict[str, str] | None = None, new_session: bool = True
    ) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(self.write(code))],
            cwd=self.tmp_path,
            env=self.env(extra_env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=new_session,  # its own process group, for killpg tests
        )

    def run_file(
        self, path: pathlib.Path, args: list[str], timeout: float = 90
    ) -> ScriptResult:
        """Run a program file of the test tree (``tests/programs``) as the owner process."""
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, str(path), *args],
            cwd=self.tmp_path,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        return self.finish(proc, timeout, t0)

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

    def run(
        self, code: str, timeout: float = 90, extra_env: dict[str, str] | None = None
    ) -> ScriptResult:
        t0 = time.monotonic()
        return self.finish(self.start(code, extra_env), timeout, t0)


@pytest.fixture
def scripts(tmp_path: pathlib.Path) -> Iterator[Scripts]:
    s = Scripts(tmp_path)
    yield s
    leftover_processes(s.mark, grace=0)  # never leave anything behind, even on failure


PRELUDE = """
import json, os, signal, sys, time
import multiprocessing as mp
import wandb_funnel as wf

def report(**kw):
    # One write per line: ranks share torchrun's stdout, and print() writes the text and
    # its newline separately when unbuffered, so two ranks' lines could run together.
    sys.stdout.write("REPORT " + json.dumps(kw) + "\\n")
    sys.stdout.flush()
"""


def reports(stdout: str) -> dict:
    """Merge every ``REPORT {json}`` line a scenario printed."""
    import json

    out: dict = {}
    for line in stdout.splitlines():
        if line.startswith("REPORT "):
            out.update(json.loads(line[len("REPORT ") :]))
    return out


def wait_for_report(proc: subprocess.Popen[str], key: str, timeout: float = 60) -> dict:
    """Read the scenario's stdout until a REPORT carrying ``key`` arrives (bounded)."""
    import json
    import selectors

    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    seen: dict = {}
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
