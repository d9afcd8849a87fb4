"""Shared fixtures: a private WANDB_DIR per test, and scripts run as real owner processes
whose every descendant (logger, wandb-core, workers) must be gone when the test ends."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from wandb_funnel.soak import jobenv
from wandb_funnel.soak.runfile import recording_env

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

    def __init__(self, tmp_path: pathlib.Path, recording: bool = False) -> None:
        self.tmp_path = tmp_path
        self.wandb_dir = tmp_path
        self.mark = uuid.uuid4().hex
        # @pytest.mark.sink("record"): the funnel's own semantics, read back from the
        # recording sink (no wandb-core, no leet inspect); find_runs/only_run read either.
        self.recording = recording

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return jobenv.clean_environment(
            self.wandb_dir,
            self.tmp_path,
            mark=self.mark,
            mark_var=MARK_VAR,
            drop=("WANDB_",),
            extra={**(recording_env(self.wandb_dir) if self.recording else {}), **(extra or {})},
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

    def run_command(
        self, argv: list[str], extra_env: dict[str, str] | None = None, timeout: float = 200
    ) -> subprocess.CompletedProcess[str]:
        """Run a command (a launcher, ``wandb-funnel run``, pytest) in this scenario's
        directory and environment, its output captured; its exit status is not checked."""
        return subprocess.run(
            argv,
            cwd=self.tmp_path,
            env=self.env(extra_env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

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
def scripts(tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> Iterator[Scripts]:
    sink = request.node.get_closest_marker("sink")  # the nearest: a test's over its module's
    if sink is not None and sink.args not in (("record",), ("wandb",)):
        raise pytest.UsageError(f"{request.node.nodeid}: sink(...) takes 'record' or 'wandb'")
    s = Scripts(tmp_path, recording=sink is not None and sink.args == ("record",))
    yield s
    leftover_processes(s.mark, grace=0)  # never leave anything behind, even on failure
    if s.recording:
        # On the recording sink, nothing may have written a wandb run: a job that did ran
        # on wandb without saying so (and its test read a .wandb file, not a recording).
        wandb_runs = sorted(str(p) for p in tmp_path.rglob("run-*.wandb"))
        assert not wandb_runs, f"a test on the recording sink wrote wandb runs: {wandb_runs}"


PROGRAMS = pathlib.Path(__file__).parent / "programs"


def program(name: str) -> pathlib.Path:
    """``tests/programs/<name>.py``: a program (linted and type-checked like the package) that
    a test runs as the owner process with ``Scripts.run_file`` / ``start_file``. Most take
    the scenario to run as their first argument and print what they saw as REPORT lines
    (``tests/programs/_prelude.py``), which ``reports`` / ``wait_for_report`` read."""
    path = PROGRAMS / f"{name}.py"
    assert path.is_file(), path
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_agents(
    scripts: Scripts,
    argv: list[str],
    nproc: int,
    nnodes: int = 1,
    timeout: float = 120,
    extra_env: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (),
) -> list[subprocess.CompletedProcess[str]]:
    """``argv`` (a program and its arguments) under real torchrun: ``nnodes`` torchrun agents
    (``--nnodes N --node-rank i``, static rendezvous at a localhost master: each agent is a
    node), each in a process group of its own; one agent is ``--standalone``. ``prefix``: a
    command each agent runs under (``wandb-funnel run --``)."""
    port = free_port()
    procs = []
    for node in range(nnodes):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
        if nnodes == 1:
            cmd += ["--standalone"]
        else:
            cmd += ["--nnodes", str(nnodes), "--node-rank", str(node)]
            cmd += ["--master-addr", "127.0.0.1", "--master-port", str(port)]
        procs.append(
            subprocess.Popen(
                [*prefix, *cmd, *argv],
                cwd=scripts.tmp_path,
                env=scripts.env(extra_env),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    t0 = time.monotonic()
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:  # a hang (TimeoutExpired) must not leave an agent and its ranks behind
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    return results


def side_by_side(*jobs: Callable[[], Any]) -> list[Any]:
    """Run independent jobs at the same time and return their results in order (the first
    error raised, once all have ended). A comparison's plain-wandb run and the funnel's run
    share nothing (each its own directory, environment and processes): side by side, the
    two take little more than one on a 2-core box."""
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(job) for job in jobs]
        concurrent.futures.wait(futures)
        return [future.result() for future in futures]


def reports(stdout: str) -> dict[str, Any]:
    """Merge every ``REPORT {json}`` line a scenario printed."""
    import json

    out: dict[str, Any] = {}
    for line in stdout.splitlines():
        if line.startswith("REPORT "):
            out.update(json.loads(line[len("REPORT ") :]))
    return out


def a_lack(line: str) -> bool:
    """A line the logger says once per capability an older wandb lacks
    (``sinks/wandb/compat.py``): a test that wants the funnel silent leaves these out."""
    return line.startswith("wandb-funnel logger: this wandb (") and ") has no " in line


def wait_for_report(proc: subprocess.Popen[str], key: str, timeout: float = 60) -> dict[str, Any]:
    """Read the scenario's stdout until a REPORT carrying ``key`` arrives (bounded)."""
    import json
    import selectors

    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    sel.register(fd, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    seen: dict[str, Any] = {}
    # The pipe's bytes, read here (not through the text wrapper: a readline() there can
    # buffer the next line, which select() then never reports; two REPORTs written together
    # would wait for the deadline).
    pending = b""
    while time.monotonic() < deadline:
        if not sel.select(timeout=0.2):
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            if line.startswith("REPORT "):
                seen.update(json.loads(line[len("REPORT ") :]))
        if key in seen:
            return seen
    raise AssertionError(f"no REPORT with {key!r} within {timeout}s (got {seen})")


# ---- tiers: the gate and the full tier (tests/tiers.py) ----------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("wandb-funnel tiers")
    group.addoption(
        "--sample-seed",
        type=int,
        default=None,
        help="run a random sample of the selected tests, in an order drawn from "
        "this seed (.ci/run derives it from the commit)",
    )
    group.addoption(
        "--time-box",
        type=float,
        default=None,
        metavar="SECONDS",
        help="start no test after this long; what ran is reported as usual",
    )
    group.addoption(
        "--full",
        action="store_true",
        help="the full tier too (by default, with no -m, only the gate runs)",
    )


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests.tiers import JOB_MARKERS, in_gate

    for item in items:
        starts_a_job = any(item.get_closest_marker(m) for m in JOB_MARKERS)
        if starts_a_job and not item.get_closest_marker("gate") and not in_gate(item.nodeid):
            item.add_marker(pytest.mark.full)
    # `python -m pytest` (the README's command) is the gate; --full or any -m chooses.
    if not config.getoption("--full") and not config.option.markexpr:
        full = [item for item in items if item.get_closest_marker("full")]
        if full:
            config.hook.pytest_deselected(items=full)
            items[:] = [item for item in items if not item.get_closest_marker("full")]


class _Sample:
    """``--sample-seed``: the selected tests shuffled by the seed; ``--time-box``: stop
    starting tests once it has passed (the sample's order decides which ran)."""

    def __init__(self, seed: int | None, box: float | None) -> None:
        self.seed, self.box = seed, box
        self.started = time.monotonic()
        self.ran = 0
        self.selected = 0
        self.boxed = False

    @pytest.hookimpl(trylast=True)  # after -m has deselected
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        if self.seed is not None:
            import random

            random.Random(self.seed).shuffle(items)
        self.selected = len(items)

    def pytest_sessionstart(self) -> None:
        self.started = time.monotonic()

    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        self.ran += 1
        if self.box is not None and time.monotonic() - self.started > self.box:
            self.boxed = True
            item.session.shouldstop = (
                f"time box of {self.box:.0f}s reached: {self.ran} of {self.selected} "
                f"selected tests ran (seed {self.seed})"
            )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # Stopping at the time box is the plan, not an interruption: the status is what the
        # tests that ran say.
        if self.boxed and session.exitstatus == pytest.ExitCode.INTERRUPTED:
            session.exitstatus = (
                pytest.ExitCode.TESTS_FAILED if session.testsfailed else pytest.ExitCode.OK
            )


def pytest_configure(config: pytest.Config) -> None:
    from tests.tiers import FULL_RUN_ENV

    if config.getoption("--full") or "full" in (config.option.markexpr or ""):
        os.environ[FULL_RUN_ENV] = "1"
    seed, box = config.getoption("--sample-seed"), config.getoption("--time-box")
    if seed is not None or box is not None:
        config.pluginmanager.register(_Sample(seed, box), "wandb-funnel-sample")
