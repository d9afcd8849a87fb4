"""Runs one soak iteration: a program (or a user's command) with a private WANDB_DIR and
TMPDIR, a fault, then every check.

Every process of the job carries a marker in its environment (the logger, wandb-core, workers
and torchrun ranks inherit it; see ``jobenv``), so the harness finds them all with psutil: to
sample their memory, to pick a fault's target, and to prove that none is left behind.
"""

from __future__ import annotations

import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from wandb_funnel.soak import probe
from wandb_funnel.soak.jobenv import MARK_VAR, clean_environment, describe, marked_processes
from wandb_funnel.soak.runfile import find_runs
from wandb_funnel.soak.scenarios import Scenario

__all__ = ["LINGER_LIMIT", "MARK_VAR", "Iteration", "run_iteration"]
# After the owner exits, the rest of the job (the logger finishing the run, wandb-core noticing
# its parent is gone) must be gone within this long, or it counts as left behind.
LINGER_LIMIT = 15.0
_TICK = 0.1
_END_JOB_WAIT = 5.0  # for SIGKILLed processes to be gone (a stopped one is killed too)


@dataclass
class Iteration:
    scenario: str
    index: int
    seed: str
    plain: bool = False
    directory: str = ""
    hang: bool = False
    owner_exit: int | None = None
    run_exits: list[int | None] = field(default_factory=list)
    exit_s: float | None = None  # end of training (or the fault) to every process gone
    sent: int = 0
    logged: int = 0
    dropped: int = 0
    lost: int = 0  # negative: records in flight when a signal hit (see probe.attempt)
    lost_reason: str | None = None
    fault_done: bool = False
    fault_after_end: bool = False  # it landed after the program's last line (program_end)
    known_abort: bool = False  # a process died of Scenario.known_abort (a dependency's bug)
    closing_before_fault: bool = False  # see Scenario.run_exit_if_closing
    leftover_processes: list[str] = field(default_factory=list)
    leftover_sockets: list[str] = field(default_factory=list)
    wandb_sockets: list[str] = field(default_factory=list)  # wandb-core's, see _check_sockets
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    rates: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    fault: str | None = None  # the scenario's fault action
    command: list[str] = field(default_factory=list)
    fault_at_s: float | None = None  # when the fault landed, seconds after the start
    duration_s: float | None = None  # start to every process of the job gone
    probe_used: bool = False  # the program wrote probe events or counts: records balanced
    runs: list[dict[str, Any]] = field(default_factory=list)  # what each .wandb file says
    grace_killed: list[str] = field(default_factory=list)  # role:pid the grace's SIGKILL hit
    mark: str = ""  # the job's marker (jobenv.MARK_VAR): finds its processes
    aborted: bool = False  # the soak was aborted (a second Ctrl-C): killed, not judged

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _ppid(proc: psutil.Process) -> int | None:
    try:
        return int(proc.ppid())
    except psutil.Error:
        return None


def _role(proc: psutil.Process, owner_pid: int) -> str:
    if proc.pid == owner_pid:
        return "owner"
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:  # gone meanwhile
        return "worker"
    if "wandb_funnel._logger" in cmd:
        return "logger"
    if "wandb-core" in cmd:
        return "wandb-core"
    return "worker"


# Never the "worker" a kill-worker fault means: multiprocessing's own helper processes, and
# the ones wandb-core starts (its system monitor).
_HELPERS = (
    "multiprocessing.resource_tracker",
    "multiprocessing.forkserver",
    "multiprocessing.semaphore_tracker",
    "wandb-symon",
    "gpu_stats",
)


def _is_helper(proc: psutil.Process) -> bool:
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return True  # gone meanwhile: not a target either
    return any(h in cmd for h in _HELPERS)


class _Job:
    """The processes of one iteration, found by marker; scanning is cached by pid."""

    def __init__(self, mark: str, owner: subprocess.Popen[bytes]) -> None:
        self.mark, self.owner, self.owner_pid = mark, owner, owner.pid
        self._known: dict[tuple[int, float], bool] = {}

    def processes(self) -> list[psutil.Process]:
        return marked_processes(self.mark, MARK_VAR, self._known)

    def by_role(self, role: str) -> list[psutil.Process]:
        return [p for p in self.processes() if _role(p, self.owner_pid) == role]

    def signal_all(self, signum: int) -> list[str]:
        """Signal every process of the job; says which (role:pid) it reached.

        The owner is signalled whether or not the scan found it: it is our own child (its
        pid cannot be reused before we reap it), and a scan can miss a live process (its
        environment unreadable for a moment): the soak of 2026-11-23 saw scancel reach
        wandb-core, the logger and a worker but not the owner, once in 753 iterations."""
        reached = []
        found = self.processes()
        # Not once reaped: its pid may be anyone's then.
        if self.owner.poll() is None and all(p.pid != self.owner_pid for p in found):
            try:
                found.insert(0, psutil.Process(self.owner_pid))
            except psutil.Error:
                pass  # exited already
        for proc in found:
            try:
                proc.send_signal(signum)
                reached.append(f"{_role(proc, self.owner_pid)}:{proc.pid}")
            except psutil.Error:
                pass
        return reached


def _command(scenario: Scenario, program: str, rng: random.Random) -> list[str]:
    if scenario.command:
        return list(scenario.command)
    path = os.path.abspath(program)  # a matrix's programs are absolute (load_matrix)
    if not scenario.torchrun:
        return [sys.executable, path, *scenario.args]
    nproc = scenario.torchrun if scenario.torchrun > 0 else rng.randint(2, 4)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        path,
        *scenario.args,
    ]


def _environment(
    mark: str, wandb_dir: pathlib.Path, tmp: str, events: str, sent: str, seed: str
) -> dict[str, str]:
    return clean_environment(
        wandb_dir,
        tmp,
        mark=mark,
        extra={
            probe.EVENTS_ENV: events,
            probe.SENT_ENV: sent,
            probe.SEED_ENV: seed,
            # One thread per process unless the caller chose: 2-4 ranks on a small machine.
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        },
    )


class _Fault:
    """Injects a scenario's fault after a random delay: from the program's ``ready`` event,
    or, for a program that does not use the probe (``Fault.needs_probe=False``), from its
    start."""

    def __init__(
        self,
        scenario: Scenario,
        job: _Job,
        rng: random.Random,
        owner: subprocess.Popen[bytes],
        started: float,
    ) -> None:
        self.spec = scenario.fault
        self.owner = owner
        self.job, self.rng = job, rng
        self.started = started  # time.monotonic() at the owner's start
        self.delay: float | None = None
        self.ready_at: float | None = None
        self.done_at: float | None = None
        self.later: list[tuple[float, Callable[[], None]]] = []
        self.stopped: list[psutil.Process] = []
        self.worker_pids: set[int] = set()  # pids that said ``worker`` (never rank 0)
        self.signalled: list[str] = []  # role:pid reached by a job-wide signal (scancel)
        self.killed: list[str] = []  # role:pid reached by the SIGKILL that ends a grace
        self.injections = 0  # how many times the fault was injected (Fault.times)
        self.hit: set[int] = set()  # pids a kill fault has killed

    def tick(self, ready: bool, probe_used: bool, now: float) -> None:
        for when, action in list(self.later):
            if now >= when:
                self.later.remove((when, action))
                action()
        if self.spec is None or self.injections >= self.spec.times:
            return
        if self.spec.needs_probe or probe_used:
            if self.ready_at is None:
                if not ready:
                    return
                self.ready_at = now
            if self.delay is None:
                self.delay = self.rng.uniform(*self.spec.delay)
            due = self.ready_at + self.delay
        else:
            if self.delay is None:
                self.delay = self.rng.uniform(*self.spec.delay)
            due = self.started + self.delay
        if now >= due and self._inject(now):
            self.injections += 1
            if self.done_at is None:
                self.done_at = time.time()
            self.ready_at, self.delay = now, None  # the next one, if any, after a new delay

    def _kill_all(self) -> None:
        self.killed = self.job.signal_all(signal.SIGKILL)

    def _inject(self, now: float) -> bool:
        assert self.spec is not None
        action, owner = self.spec.action, self.job.owner_pid
        if self.owner.poll() is not None:
            return False  # reaped: its pid (and process group id) may belong to anyone now
        grace = self.rng.uniform(*self.spec.grace)
        if action == "sigint-group":
            os.killpg(owner, signal.SIGINT)
        elif action == "preempt":
            os.killpg(owner, signal.SIGTERM)
            self.later.append((now + grace, self._kill_group))
        elif action == "scancel":
            self.signalled = self.job.signal_all(signal.SIGTERM)
            self.later.append((now + grace, self._kill_all))
        elif action == "sigterm-owner":
            os.kill(owner, signal.SIGTERM)
        elif action == "kill-worker":
            return self._kill_one("worker")
        elif action == "kill-logger":
            return self._kill_one("logger")
        elif action == "kill-wandb-core":
            return self._kill_one("wandb-core")
        elif action == "stall-wandb-core":
            for proc in self.job.by_role("wandb-core"):
                try:
                    proc.suspend()
                except psutil.Error:
                    continue  # exited since the scan
                self.stopped.append(proc)
            if not self.stopped:
                return False
            self.later.append((now + grace, self.resume))
        else:
            raise ValueError(f"unknown fault action {action!r}")
        return True

    def _kill_group(self) -> None:
        if self.owner.poll() is None:  # not reaped, so the group id is still the job's
            self.killed = [
                f"{_role(p, self.job.owner_pid)}:{p.pid}"
                for p in self.job.processes()
                if _pgid(p.pid) == self.owner.pid
            ]
            _killpg(self.owner.pid)

    def _kill_one(self, role: str) -> bool:
        candidates = [p for p in self.job.by_role(role) if p.pid not in self.hit]
        if role == "wandb-core":
            # The run's wandb-core: the logger's own (the owner's, started by wandb.setup()
            # before any process, holds no run of the funnel's).
            loggers = {p.pid for p in self.job.by_role("logger")}
            of_logger = [p for p in candidates if _ppid(p) in loggers]
            candidates = of_logger or candidates
        if role == "worker":
            announced = [p for p in candidates if p.pid in self.worker_pids]
            # A program that announces no worker (a user's) may lose any of its processes.
            if announced or self.spec is None or self.spec.needs_probe:
                candidates = announced
            else:
                candidates = [p for p in candidates if not _is_helper(p)]
        if not candidates:
            return False
        try:
            victim = self.rng.choice(candidates)
            victim.kill()
        except psutil.Error:
            return False
        self.hit.add(victim.pid)
        return True

    def resume(self) -> None:
        for proc in self.stopped:
            try:
                proc.resume()
            except psutil.Error:
                pass
        self.stopped = []


def _dump_stacks(job: _Job, path: pathlib.Path) -> None:
    """Where a hung job is stuck: every process's Python stacks, when py-spy is installed."""
    spy = shutil.which("py-spy") or str(pathlib.Path(sys.executable).with_name("py-spy"))
    if not os.path.exists(spy):
        return
    with open(path, "w") as out:
        for proc in job.processes():
            out.write(f"==== {_describe(proc)}\n")
            out.flush()
            out.write(_thread_signal_state(proc.pid))
            out.flush()
            try:
                subprocess.run(
                    [spy, "dump", "--pid", str(proc.pid)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=20,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                out.write("(py-spy timed out)\n")


def _thread_signal_state(pid: int) -> str:
    """Each thread's pending, blocked and caught signal masks (Linux): a signal that is
    pending but never handled shows which thread the kernel gave it to."""
    lines = []
    keys = (b"Name", b"State", b"SigPnd", b"ShdPnd", b"SigBlk", b"SigIgn", b"SigCgt")
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return ""
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status", "rb") as f:
                fields = [
                    ln.decode(errors="replace").strip() for ln in f if ln.split(b":")[0] in keys
                ]
        except OSError:
            continue
        lines.append(f"  thread {tid}: " + "  ".join(fields))
    return "\n".join(lines) + "\n" if lines else ""


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _describe(proc: psutil.Process) -> str:
    return describe(proc, 100)


def run_iteration(
    scenario: Scenario,
    index: int,
    out_dir: pathlib.Path,
    seed: str,
    plain: bool = False,
    abort: threading.Event | None = None,
) -> Iteration:
    """Run ``scenario`` once (its plain-wandb program when ``plain``) and check everything.

    The iteration's directory (``out_dir/<name>-<index>``) is the job's ``WANDB_DIR`` and
    holds its stdout, stderr and probe files. A matrix's program runs there; a user's command
    (``Scenario.command``) runs in the current directory, where its relative paths point.
    Once ``abort`` is set the job is killed and the iteration returned ``aborted``, unjudged.
    Whatever happens here, no process of the job and none of its temp files outlive the call:
    an error of the harness itself fails this iteration (``harness error: ...``, its traceback
    in ``harness-error.txt``) instead of ending the soak with the job still running.
    """
    program = scenario.plain if plain and scenario.plain else scenario.program
    it = Iteration(scenario.name, index, seed, plain)
    it.fault = scenario.fault.action if scenario.fault else None
    directory = out_dir / f"{scenario.name}{'-plain' if plain else ''}-{index:04d}"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    directory = directory.resolve()  # the job may run elsewhere: its paths must be absolute
    it.directory = str(directory)
    if abort is not None and abort.is_set():
        it.aborted = True
        return it
    # Short on purpose: the logger's IPC socket lives under TMPDIR (sun_path is 108 bytes).
    tmp = tempfile.mkdtemp(prefix="wfs-")
    try:
        _run_job(scenario, it, program, directory, tmp, plain, abort)
    except Exception as exc:  # the job is gone already: _run_job's finally ended it
        (directory / "harness-error.txt").write_text(traceback.format_exc())
        it.problems.append(f"harness error: {exc!r} (traceback in harness-error.txt)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return it


def _run_job(
    scenario: Scenario,
    it: Iteration,
    program: str,
    directory: pathlib.Path,
    tmp: str,
    plain: bool,
    abort: threading.Event | None,
) -> None:
    events, sent = str(directory / "events.jsonl"), str(directory / "sent.bin")
    probe.create_sent_file(sent)
    rng = random.Random(it.seed)
    mark = it.mark = uuid.uuid4().hex
    it.command = _command(scenario, program, rng)
    cwd = os.getcwd() if scenario.command else directory
    with open(directory / "stdout.txt", "wb") as out, open(directory / "stderr.txt", "wb") as err:
        try:
            proc = subprocess.Popen(
                it.command,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=_environment(mark, directory, tmp, events, sent, it.seed),
                start_new_session=True,
            )
        except OSError as exc:  # a user's command that cannot start at all
            it.problems.append(f"cannot start {it.command[0]!r}: {exc}")
            return
    job = _Job(mark, proc)
    try:
        _supervise(scenario, it, proc, job, events, rng, plain, abort)
        if not it.aborted:
            _check_sockets(it, tmp)
            _account(scenario, it, directory, sent, plain)
    finally:
        _end_job(job, it)


def _end_job(job: _Job, it: Iteration) -> None:
    """SIGKILL every process of the job until a scan finds none (bounded): one scan misses a
    process forked after it started, or one whose environment was unreadable for a moment.
    A process still there after that fails the iteration."""
    if job.owner.poll() is None:  # never killpg a reaped owner's pid: it may be reused
        _killpg(job.owner_pid)
    deadline = time.monotonic() + _END_JOB_WAIT
    while True:
        job.signal_all(signal.SIGKILL)
        left = job.processes()
        if not left or time.monotonic() > deadline:
            break
        # Not the owner: only job.owner may reap it (psutil's wait would, behind its back).
        psutil.wait_procs([p for p in left if p.pid != job.owner_pid], timeout=0.2)
    try:
        job.owner.wait(timeout=max(0.0, deadline - time.monotonic()) + 1.0)
    except subprocess.TimeoutExpired:
        pass  # listed just below
    survivors = [_describe(p) for p in left]
    if job.owner.poll() is None:
        survivors.append(f"{job.owner_pid} (the owner)")
    if survivors:
        it.problems.append(f"survived SIGKILL for {_END_JOB_WAIT:.0f}s: {survivors}")


def _supervise(
    scenario: Scenario,
    it: Iteration,
    proc: subprocess.Popen[bytes],
    job: _Job,
    events: str,
    rng: random.Random,
    plain: bool,
    abort: threading.Event | None,
) -> None:
    t_start, wall_start = time.monotonic(), time.time()
    fault = _Fault(scenario, job, rng, proc, t_start)
    deadline = t_start + scenario.deadline
    owner_gone: float | None = None
    seen_events = 0
    ready = False
    all_gone_at: float | None = None
    while True:
        now = time.monotonic()
        evs = probe.read_events(events)
        for ev in evs[seen_events:]:
            if ev["event"] == "ready":
                ready = True
            elif ev["event"] == "worker" and ev.get("slot", 1) != 0:
                fault.worker_pids.add(ev["pid"])
        seen_events = len(evs)
        fault.tick(ready, seen_events > 0, now)
        alive = job.processes()
        for p in alive:
            role = _role(p, proc.pid)
            try:
                rss = p.memory_info().rss / 2**20
            except psutil.Error:
                continue
            it.peak_rss_mb[role] = round(max(it.peak_rss_mb.get(role, 0.0), rss), 1)
        if owner_gone is None and proc.poll() is not None:
            owner_gone = now
            it.owner_exit = proc.returncode
        if owner_gone is not None and not alive:
            all_gone_at = time.time()
            break
        if owner_gone is None and now > deadline:
            it.hang = True
            it.problems.append(f"hang: still running after its {scenario.deadline:.0f}s deadline")
            _dump_stacks(job, pathlib.Path(it.directory) / "hang-stacks.txt")
            break
        if owner_gone is not None and now > min(deadline, owner_gone + LINGER_LIMIT):
            break
        if abort is not None and abort.is_set():
            it.aborted = True
            fault.resume()
            return  # run_iteration kills the job
        time.sleep(_TICK)
    fault.resume()
    left = job.processes()
    it.leftover_processes = [_describe(p) for p in left]
    if left and not it.hang:
        it.problems.append(f"left behind: {it.leftover_processes}")
    if proc.poll() is None:  # never killpg a reaped owner's pid: it may be reused
        _killpg(proc.pid)
    job.signal_all(signal.SIGKILL)
    it.fault_done = fault.done_at is not None
    it.grace_killed = fault.killed
    final = probe.read_events(events, final=True)  # the job has ended
    it.probe_used = bool(final)
    if fault.done_at is not None:
        it.fault_at_s = round(fault.done_at - wall_start, 3)
    if all_gone_at is not None:
        it.duration_s = round(all_gone_at - wall_start, 3)
    it.closing_before_fault = fault.done_at is not None and any(
        ev["event"] == "run_closing" and ev["t"] < fault.done_at + scenario.closing_window
        for ev in final
    )
    it.fault_after_end = fault.done_at is not None and any(
        ev["event"] == "program_end" and ev["t"] <= fault.done_at for ev in final
    )
    ends = [ev["t"] for ev in final if ev["event"] == "train_end"]
    t0 = (
        fault.done_at
        if (fault.done_at and scenario.fault and scenario.fault.ends_training)
        else (max(ends) if ends else None)
    )
    if all_gone_at is not None and t0 is not None:
        it.exit_s = round(max(0.0, all_gone_at - t0), 3)
    it.rates = [round(ev["per_s"]) for ev in final if ev["event"] == "rate"]
    if not plain and it.owner_exit is not None and scenario.owner_exit is not None:
        if _expect_fault_effects(scenario, it):
            expected = scenario.owner_exit
        elif it.fault_after_end:
            # After the program's last line a signal meets CPython's own exit: its handler
            # ran first (the scenario's code), or ran inside atexit, which swallows its
            # SystemExit (0), or came after the handlers were gone (killed by the signal).
            expected = (*scenario.owner_exit, 0, -signal.SIGTERM)
        else:
            expected = ()
        if expected and it.owner_exit not in expected:
            known = scenario.known_abort
            if known and known in _read_tail(pathlib.Path(it.directory) / "stderr.txt"):
                it.known_abort = True  # torch's, not ours: counted apart (Scenario.known_abort)
            else:
                reached = f" (the fault reached {fault.signalled})" if fault.signalled else ""
                it.problems.append(f"owner exit code {it.owner_exit}, expected {expected}{reached}")


def _read_tail(path: pathlib.Path, limit: int = 65536) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _expect_fault_effects(scenario: Scenario, it: Iteration) -> bool:
    """False when the program ended before its fault was due, or when the fault landed
    after the program's last line (``program_end``: the interpreter's own exit, not the
    product's): the exit codes the fault would cause cannot be checked then. Such iterations
    are counted apart ("faults missed"), so a soak that never hits its faults cannot pass
    for a green one."""
    return scenario.fault is None or (it.fault_done and not it.fault_after_end)


def _check_sockets(it: Iteration, tmp: str) -> None:
    """Ours (the logger's private ``wandb-funnel-*`` directory) must be gone. wandb-core's
    own sockets (``wandb_symon-*.sock``) are listed apart: a SIGTERMed or SIGKILLed
    wandb-core leaves them, and nothing of ours can remove them."""
    for root, dirs, files in os.walk(tmp):
        for name in dirs + files:
            path = os.path.relpath(os.path.join(root, name), tmp)
            if path.startswith("wandb-funnel-"):
                it.leftover_sockets.append(path)
            elif name.endswith(".sock"):
                it.wandb_sockets.append(path)
    shutil.rmtree(tmp, ignore_errors=True)
    if it.leftover_sockets and not it.plain:
        it.problems.append(f"socket files left: {it.leftover_sockets}")


def _account(
    scenario: Scenario, it: Iteration, directory: pathlib.Path, sent: str, plain: bool
) -> None:
    """What the ``.wandb`` files say, and, when the program counted what it sent through the
    probe, the balance sent = logged + dropped (+ lost with a reason). A program that never
    used the probe (a user's) is not balanced: nothing says what it sent."""
    returned, attempted = probe.read_sent_file(sent)
    it.probe_used = it.probe_used or any(attempted)
    it.sent = sum(returned)
    in_flight = sum(attempted) - it.sent  # calls a signal interrupted before they counted
    try:
        runs = find_runs(directory)
    except (subprocess.SubprocessError, OSError, ValueError) as exc:
        it.problems.append(f"cannot read the .wandb file: {exc}")
        return
    it.run_exits = [r.exit_code for r in runs]
    it.runs = [
        {
            "file": str(r.path.relative_to(directory)),
            "exit_code": r.exit_code,
            "history_rows": len(r.history),
            "records": r.summary.get("_funnel/records"),
            "dropped_records": r.summary.get("_funnel/dropped_records"),
        }
        for r in runs
    ]
    it.dropped = sum(int(r.summary.get("_funnel/dropped_records", 0)) for r in runs)
    if it.probe_used:
        it.logged = sum(r.count_cells(r"r\d+") for r in runs)
        it.lost = it.sent - it.logged - it.dropped
    if plain:
        return
    if it.lost < 0 and -it.lost > in_flight:
        it.problems.append(f"{-it.lost} more records in the run than were sent")
    elif it.lost > 0:
        if scenario.may_lose:
            it.lost_reason = scenario.may_lose
        elif scenario.may_lose_if_killed and it.grace_killed:
            it.lost_reason = scenario.may_lose_if_killed
        else:
            unaccounted = sum("_funnel/records" not in r.summary for r in runs)
            hint = (
                f" ({unaccounted} run(s) without the funnel's accounting in the summary: the "
                f"logger did not finish them)"
                if unaccounted
                else ""
            )
            it.problems.append(f"{it.lost} records lost without a reason{hint}")
    if scenario.run_exit is not None and not it.hang and _expect_fault_effects(scenario, it):
        if len(runs) != scenario.runs:
            it.problems.append(f"{len(runs)} runs written, expected {scenario.runs}")
        accepted = {scenario.run_exit}
        if scenario.run_exit_if_closing is not None and it.closing_before_fault:
            accepted.add(scenario.run_exit_if_closing)
        wrong = [c for c in it.run_exits if c not in accepted]
        if wrong:
            it.problems.append(f"run exit records {it.run_exits}, expected {scenario.run_exit}")
