"""The soak harness's own checks catch what they claim to: a hang, a process left behind,
records lost without a reason, a wrong exit code (each case a small misbehaving program);
and its parts work as documented: matrix files, a user's fault list, the fault's timing, the
job's environment and the marker scan."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import queue
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Any

import pytest

from wandb_funnel import _soak_command, cli
from wandb_funnel.soak import faults, harness, jobenv, probe
from wandb_funnel.soak.harness import run_iteration
from wandb_funnel.soak.scenarios import (
    USER_FAULTS,
    Fault,
    Scenario,
    load_matrix,
    select,
    user_matrix,
)

# The cases that run a misbehaving program are marked soak and processes; the rest are pure
# (tox -e unit runs them).
REPO = pathlib.Path(__file__).resolve().parents[2]


def _scenario(tmp_path: pathlib.Path, code: str, **kw: object) -> Scenario:
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(code))
    return Scenario("misbehaving", "a program that breaks a rule", str(program), **kw)  # type: ignore[arg-type]


@pytest.mark.soak
@pytest.mark.processes
def test_a_hang_is_caught_and_killed(tmp_path: pathlib.Path) -> None:
    scenario = _scenario(tmp_path, "import time\ntime.sleep(600)\n", deadline=2, run_exit=None)
    it = run_iteration(scenario, 1, tmp_path / "out", "s")
    assert it.hang and not it.ok
    assert any("hang" in p for p in it.problems)


@pytest.mark.soak
@pytest.mark.processes
def test_a_process_left_behind_is_caught(tmp_path: pathlib.Path) -> None:
    code = """
    import subprocess, sys
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                     start_new_session=True)
    """
    it = run_iteration(
        _scenario(tmp_path, code, deadline=20, run_exit=None), 1, tmp_path / "out", "s"
    )
    assert not it.hang and len(it.leftover_processes) == 1
    assert any("left behind" in p for p in it.problems)


@pytest.mark.soak
@pytest.mark.processes
def test_records_lost_without_a_reason_are_caught(tmp_path: pathlib.Path) -> None:
    code = """
    import wandb_funnel as wf
    from wandb_funnel.soak import probe
    with wf.Funnel(project="t"):
        for step in range(10):
            wf.log({"r1": step}, step=step)
            probe.count(1)
        probe.count(1, 5)  # claims five records it never logged
    """
    it = run_iteration(_scenario(tmp_path, code), 1, tmp_path / "out", "s")
    assert (it.sent, it.logged, it.dropped, it.lost) == (15, 10, 0, 5)
    assert it.problems == ["5 records lost without a reason"]


@pytest.mark.soak
@pytest.mark.processes
def test_a_wrong_exit_code_is_caught(tmp_path: pathlib.Path) -> None:
    code = """
    import sys, wandb_funnel as wf
    from wandb_funnel.soak import probe
    wf.init(project="t").log({"r0": 1}); probe.count(0)
    sys.exit(3)
    """
    it = run_iteration(_scenario(tmp_path, code), 1, tmp_path / "out", "s")
    assert it.owner_exit == 3 and it.run_exits == [3]
    assert any("owner exit code 3" in p for p in it.problems)
    assert any("run exit records [3]" in p for p in it.problems)


def test_the_projects_matrix_loads_with_every_program_in_place() -> None:
    scenarios = load_matrix(REPO / "soak" / "scenarios.py")
    assert len(scenarios) >= 20
    for s in scenarios:
        for program in (s.program, s.plain):
            if program:
                assert os.path.isabs(program) and os.path.isfile(program), (s.name, program)
    assert {s.name for s in select(scenarios, ["torchrun*"])} == {
        "torchrun",
        "torchrun-rank-raises",
        "torchrun-sigterm",
        "torchrun-rank-killed",
        "torchrun-logger-killed",
    }
    with pytest.raises(ValueError, match="no scenario matches"):
        select(scenarios, ["no-such-scenario"])


def test_a_matrix_resolves_programs_in_its_directory_or_its_programs(
    tmp_path: pathlib.Path,
) -> None:
    own = tmp_path / "own.py"
    own.write_text(
        "from wandb_funnel.soak.scenarios import Scenario\n"
        "SCENARIOS = [Scenario('a', 'x', 'a.py', plain='b.py'),\n"
        "             Scenario('b', 'y', '/abs/c.py')]\n"
    )
    a, b = load_matrix(own)
    assert (a.program, a.plain, b.program) == (
        str(tmp_path / "a.py"),
        str(tmp_path / "b.py"),
        "/abs/c.py",
    )
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text(
        "from wandb_funnel.soak.scenarios import Scenario\n"
        "PROGRAMS = '/progs'\nSCENARIOS = [Scenario('a', 'x', 'a.py')]\n"
    )
    assert load_matrix(elsewhere)[0].program == "/progs/a.py"
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    with pytest.raises(ValueError, match="must define SCENARIOS"):
        load_matrix(empty)
    twice = tmp_path / "twice.py"
    twice.write_text(
        "from wandb_funnel.soak.scenarios import Scenario\n"
        "SCENARIOS = [Scenario('a', 'x', 'a.py'), Scenario('a', 'y', 'b.py')]\n"
    )
    with pytest.raises(ValueError, match="used twice: a"):
        load_matrix(twice)


def test_a_users_faults_are_reported_not_judged() -> None:
    everything = user_matrix(["python", "train.py"])
    assert [s.name for s in everything] == list(USER_FAULTS)
    chosen = user_matrix(
        ["python", "train.py"],
        ["preempt", "none", "kill-logger"],
        fault_after=(1.0, 2.0),
        grace=(5.0, 6.0),
        deadline=50,
    )
    preempt, none, logger = chosen
    for s in chosen:
        assert s.command == ("python", "train.py") and s.deadline == 50
        assert s.owner_exit is None and s.run_exit is None  # reported, not judged
    assert none.fault is None and none.may_lose is None
    assert preempt.fault == Fault("preempt", delay=(1.0, 2.0), grace=(5.0, 6.0), needs_probe=False)
    assert preempt.may_lose is None and preempt.may_lose_if_killed
    assert logger.fault is not None and logger.fault.grace == (0.0, 0.0) and logger.may_lose
    with pytest.raises(ValueError, match="unknown fault"):
        user_matrix(["python", "train.py"], ["kill-everything"])
    with pytest.raises(ValueError, match="unknown fault action"):
        Fault("explode")


class _Owner:
    def poll(self) -> int | None:
        return None


def _timed_fault(needs_probe: bool) -> tuple[Any, list[float]]:
    scenario = Scenario(
        "t",
        "t",
        command=("x",),
        fault=Fault("kill-logger", delay=(2.0, 2.0), needs_probe=needs_probe),
    )
    fault = faults.FaultInjector(scenario, None, random.Random(0), _Owner(), started=100.0)  # type: ignore[arg-type]
    landed: list[float] = []

    def inject(now: float) -> bool:
        landed.append(now)
        return True

    fault._inject = inject  # type: ignore[method-assign]
    return fault, landed


def test_a_fault_lands_after_ready_or_after_the_start() -> None:
    # A user's program that never speaks through the probe: from the start.
    fault, landed = _timed_fault(needs_probe=False)
    fault.tick(ready=False, probe_used=False, now=101.9)
    fault.tick(ready=False, probe_used=False, now=102.0)
    assert landed == [102.0]
    # One that does (it wrote an event): from its ``ready``, as the matrix's programs.
    fault, landed = _timed_fault(needs_probe=False)
    fault.tick(ready=False, probe_used=True, now=105.0)
    fault.tick(ready=True, probe_used=True, now=106.0)
    fault.tick(ready=True, probe_used=True, now=107.9)
    assert landed == []
    fault.tick(ready=True, probe_used=True, now=108.0)
    assert landed == [108.0]
    fault.tick(ready=True, probe_used=True, now=200.0)
    assert landed == [108.0]  # once
    # A matrix's program: never without ``ready``.
    fault, landed = _timed_fault(needs_probe=True)
    fault.tick(ready=False, probe_used=False, now=500.0)
    assert landed == []


def test_the_clean_environment() -> None:
    base = {
        "PATH": "/bin",
        "WANDB_API_KEY": "k",
        "WANDB_MODE": "online",
        "_WANDB_FUNNEL_ADDRESS": "ipc://x",
        "TORCHELASTIC_RUN_ID": "r",
        "HOME": "/h",
    }
    env = jobenv.clean_environment("/w", "/t", mark="m", base=base, extra={"A": "1"})
    assert env == {
        "PATH": "/bin",
        "HOME": "/h",
        "WANDB_DIR": "/w",
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "TMPDIR": "/t",
        "PYTHONUNBUFFERED": "1",
        jobenv.MARK_VAR: "m",
        "A": "1",
    }
    # The test suite's and the benchmarks' variants: only WANDB_* dropped, TMPDIR the same
    # directory, no PYTHONUNBUFFERED, another marker variable.
    env = jobenv.clean_environment(
        "/w", base=base, drop=("WANDB_",), unbuffered=False, mark="n", mark_var="OTHER_MARK"
    )
    assert env["TORCHELASTIC_RUN_ID"] == "r" and env["TMPDIR"] == "/w"
    assert "PYTHONUNBUFFERED" not in env and "WANDB_API_KEY" not in env
    assert env["OTHER_MARK"] == "n" and jobenv.MARK_VAR not in env


@pytest.mark.soak
@pytest.mark.processes
def test_marked_processes_are_found_and_leftovers_killed(tmp_path: pathlib.Path) -> None:
    mark = uuid.uuid4().hex
    env = jobenv.clean_environment(tmp_path, mark=mark, mark_var="WANDB_FUNNEL_TEST_SCAN")
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True
    )
    try:
        cache: dict[tuple[int, float], bool] = {}
        found = jobenv.marked_processes(mark, "WANDB_FUNNEL_TEST_SCAN", cache)
        assert [p.pid for p in found] == [proc.pid]
        assert jobenv.marked_processes(mark, "WANDB_FUNNEL_TEST_SCAN", cache)[0].pid == proc.pid
        assert jobenv.marked_processes(mark) == []  # another variable: not found
        left = jobenv.leftover_processes(mark, "WANDB_FUNNEL_TEST_SCAN", grace=0.2)
        assert len(left) == 1 and left[0].startswith(f"{proc.pid} ")
        assert proc.wait(timeout=10) == -9
        assert jobenv.marked_processes(mark, "WANDB_FUNNEL_TEST_SCAN") == []
    finally:
        proc.kill()
        proc.wait()


def test_the_command_line() -> None:
    assert _soak_command._seconds_range("3") == (3.0, 3.0)
    assert _soak_command._seconds_range("1.5:4") == (1.5, 4.0)
    for bad in ("4:1", "-1", "x", "1:2:3"):
        with pytest.raises(argparse.ArgumentTypeError):
            _soak_command._seconds_range(bad)
    for argv in (
        ["soak"],
        ["soak", "--matrix", "m.py", "--", "python", "x.py"],
        ["soak", "--fault", "nope", "--", "python", "x.py"],
        ["soak", "--scenario", "x", "--", "python", "x.py"],
        ["soak", "--"],
    ):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2, argv


@pytest.mark.soak
@pytest.mark.processes
def test_a_marked_process_on_a_pid_seen_before_is_signalled(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan never yields psutil's cached object of a dead process for a new process on the
    same pid (psutil would then refuse to signal it as 'PID reused'). psutil.process_iter's
    shared cache is what did that; the scan must not use it."""
    import psutil

    def no_shared_cache(*args: object, **kwargs: object) -> None:
        raise AssertionError("psutil.process_iter's module-wide cache is not thread-safe")

    monkeypatch.setattr(psutil, "process_iter", no_shared_cache)
    mark = uuid.uuid4().hex
    env = jobenv.clean_environment(tmp_path, mark=mark, mark_var="WANDB_FUNNEL_TEST_SCAN")
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True
    )
    try:
        (found,) = jobenv.marked_processes(mark, "WANDB_FUNNEL_TEST_SCAN")
        found.send_signal(signal.SIGTERM)  # a fresh object: psutil lets the signal through
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


def test_events_being_written_are_read_whole_or_not_at_all(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "ready", "t": 1}\n{"event": "wor')  # the second still written
    assert probe.read_events(str(path)) == [{"event": "ready", "t": 1}]
    # Once the job has ended nothing is writing: a whole last line counts, a cut one never.
    path.write_text('{"event": "ready", "t": 1}\n{"event": "end", "t": 2}')
    assert [e["event"] for e in probe.read_events(str(path), final=True)] == ["ready", "end"]
    path.write_text('{"event": "ready", "t": 1}\n{"event": "wor')
    assert [e["event"] for e in probe.read_events(str(path), final=True)] == ["ready"]
    path.write_text('{"event": "ready", "t": 1}\nnot an event\n')
    with pytest.raises(ValueError, match="Expecting value"):
        probe.read_events(str(path))


# A program that starts a marked helper in a session of its own (as the logger and wandb-core
# are), says where it is (its marker, its private TMPDIR), then waits for the harness.
_SPAWNS_AND_WAITS = """
import os, subprocess, sys, time
from wandb_funnel.soak import probe
from wandb_funnel.soak.jobenv import MARK_VAR
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                          start_new_session=True)
probe.event("ready", mark=os.environ[MARK_VAR], tmp=os.environ["TMPDIR"])
{then}
time.sleep(600)
"""


def _ready(directory: str | pathlib.Path) -> dict[str, Any]:
    """The program's ready event (its first line): its job's marker and its TMPDIR."""
    with open(pathlib.Path(directory) / "events.jsonl") as f:
        return json.loads(f.readline())  # type: ignore[no-any-return]


def _nothing_left(ready: dict[str, Any]) -> None:
    """No process of the job (the helper included) and no temp dir of it are left."""
    assert jobenv.marked_processes(ready["mark"]) == []
    assert not os.path.exists(ready["tmp"])


@pytest.mark.soak
@pytest.mark.processes
def test_a_fault_of_the_harness_fails_the_iteration_and_kills_the_job(
    tmp_path: pathlib.Path,
) -> None:
    """An exception inside the harness (here: a complete line in the events file that is not
    an event) fails that iteration, names the error, and leaves no process of the job (the
    helper has a session of its own, as the logger and wandb-core do) and no temp dir."""
    then = 'open(os.environ[probe.EVENTS_ENV], "a").write("not an event\\n")'
    code = _SPAWNS_AND_WAITS.format(then=then)
    scenario = _scenario(tmp_path, code, deadline=60, run_exit=None)
    it = run_iteration(scenario, 1, tmp_path / "out", "s")
    assert len(it.problems) == 1 and it.problems[0].startswith("harness error: JSONDecodeError")
    assert "JSONDecodeError" in (pathlib.Path(it.directory) / "harness-error.txt").read_text()
    assert not it.hang
    _nothing_left(_ready(it.directory))


@pytest.mark.soak
@pytest.mark.processes
def test_an_aborted_iteration_kills_its_job_and_is_not_judged(tmp_path: pathlib.Path) -> None:
    code = _SPAWNS_AND_WAITS.format(then="")
    scenario = _scenario(tmp_path, code, deadline=60)  # run_exit=0: would fail if judged
    abort = threading.Event()
    events = tmp_path / "out" / "misbehaving-0001" / "events.jsonl"

    def abort_once_ready() -> None:
        while not probe.read_events(str(events)):
            if abort.wait(0.05):
                return
        abort.set()

    watcher = threading.Thread(target=abort_once_ready)
    watcher.start()
    try:
        it = run_iteration(scenario, 1, tmp_path / "out", "s", abort=abort)
    finally:
        abort.set()
        watcher.join()
    assert it.aborted and it.problems == [] and not it.hang
    _nothing_left(_ready(it.directory))


@pytest.mark.soak
@pytest.mark.processes
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_a_second_ctrl_c_aborts_the_soak_and_the_table_is_still_written(
    tmp_path: pathlib.Path, signum: signal.Signals
) -> None:
    """`wandb-funnel soak -- CMD`: the first Ctrl-C (or SIGTERM) lets the running iteration
    finish; the second kills its job, writes the table (without it), and exits 128+signal."""
    program = tmp_path / "program.py"
    program.write_text(_SPAWNS_AND_WAITS.format(then=""))
    out = tmp_path / "out"
    directory = out / "iterations" / "none-0001"
    soak = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wandb_funnel",
            "soak",
            "--fault",
            "none",
            "--iterations",
            "1",
            "--wait-ready",
            "--out",
            str(out),
            "--",
            sys.executable,
            str(program),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert soak.stdout is not None and soak.stderr is not None
    stderr: queue.Queue[str] = queue.Queue()

    def read_stderr() -> None:
        for line in soak.stderr or ():
            stderr.put(line)

    reader = threading.Thread(target=read_stderr)
    reader.start()

    seen: list[str] = []

    def wait_for(prefix: str) -> None:  # a missing line fails in a minute, not a hang
        deadline = time.monotonic() + 60
        while True:
            try:
                line = stderr.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no {prefix!r} line in 60 s; exit {soak.poll()}; stderr: {seen}")
            seen.append(line)
            if line.startswith(prefix):
                return

    ready: dict[str, Any] = {}
    try:
        while not probe.read_events(str(directory / "events.jsonl")):
            assert soak.poll() is None, soak.communicate()
            time.sleep(0.05)
        ready = _ready(directory)
        soak.send_signal(signum)
        wait_for("stopping:")
        soak.send_signal(signum)  # only once the first was handled: never merged
        wait_for("aborting:")
        assert soak.wait(timeout=60) == 128 + signum
        stdout = soak.stdout.read()
    finally:
        if soak.poll() is None:
            soak.kill()
            soak.wait()
        for proc in jobenv.marked_processes(ready["mark"]) if ready else ():
            proc.kill()  # the job, if this test failed before the harness killed it
        reader.join()
        soak.stdout.close()
        soak.stderr.close()
    assert "none #1: aborted" in stdout and "0 iterations, 0 failed, 1 aborted" in stdout
    assert "Aborted: 1 running iteration(s)" in (out / "soak.md").read_text()
    assert not directory.exists()  # an aborted iteration's files are not kept (no --keep)
    _nothing_left(ready)


@pytest.mark.soak
@pytest.mark.processes
def test_an_iteration_that_cannot_run_is_a_failed_row_and_the_soak_goes_on(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception from run_iteration itself (before any job: its directory, say) fails
    that iteration, with the error, and the soak still runs the others and writes its table."""
    real = harness.run_iteration

    def breaks_once(scenario: Scenario, index: int, *args: Any, **kwargs: Any) -> Any:
        if index == 1:
            raise RuntimeError("no room for the iteration's directory")
        return real(scenario, index, *args, **kwargs)

    monkeypatch.setattr(harness, "run_iteration", breaks_once)
    out = tmp_path / "out"
    code = cli.main(
        [
            "soak",
            "--fault",
            "none",
            "--iterations",
            "2",
            "--out",
            str(out),
            "--",
            sys.executable,
            "-c",
            "pass",
        ]
    )
    assert code == 1
    runs = json.loads((out / "soak.json").read_text())["runs"]
    assert [(r["index"], r["ok"]) for r in runs] == [(1, False), (2, True)]
    assert runs[0]["problems"] == [
        'harness error: RuntimeError("no room for the iteration\'s directory")'
    ]
