"""Runs one soak iteration: a program (or a user's command) with a private WANDB_DIR and
TMPDIR, a fault, then every check.

Every process of the job carries a marker in its environment (the logger, wandb-core, workers
and torchrun ranks inherit it; see ``jobenv``), so the harness finds them all with psutil: to
sample their memory, to pick a fault's target, and to prove that none is left behind.
Its parts: ``job`` (the job's processes), ``faults`` (the fault injected), ``checks`` (the
verdict once the job has ended), ``iteration`` (what it all found: ``Iteration``).
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

import psutil

from wandb_funnel.soak import probe
from wandb_funnel.soak.checks import account, check_owner_exit, check_sockets
from wandb_funnel.soak.faults import FaultInjector
from wandb_funnel.soak.iteration import Iteration
from wandb_funnel.soak.job import Job, describe_process, dump_stacks, end_job, killpg, role_of
from wandb_funnel.soak.jobenv import MARK_VAR, clean_environment
from wandb_funnel.soak.scenarios import Scenario

__all__ = ["LINGER_LIMIT", "MARK_VAR", "Iteration", "run_iteration"]
# After the owner exits, the rest of the job (the logger finishing the run, wandb-core noticing
# its parent is gone) must be gone within this long, or it counts as left behind.
LINGER_LIMIT = 15.0
_TICK = 0.1


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
    job = Job(mark, proc)
    try:
        _supervise(scenario, it, proc, job, events, rng, plain, abort)
        if not it.aborted:
            check_sockets(it, tmp)
            account(scenario, it, directory, sent, plain)
    finally:
        end_job(job, it)


def _supervise(
    scenario: Scenario,
    it: Iteration,
    proc: subprocess.Popen[bytes],
    job: Job,
    events: str,
    rng: random.Random,
    plain: bool,
    abort: threading.Event | None,
) -> None:
    """Watch the job with its fault until it ends (or hangs, lingers or is aborted), stop
    what is left of it, then read what happened and judge the owner's exit code."""
    t_start, wall_start = time.monotonic(), time.time()
    fault = FaultInjector(scenario, job, rng, proc, t_start)
    all_gone_at = _watch(scenario, it, proc, job, events, fault, t_start, abort)
    fault.resume()
    if it.aborted:
        return  # run_iteration kills the job
    _stop_what_is_left(it, proc, job)
    _read_outcome(scenario, it, fault, events, wall_start, all_gone_at)
    if not plain:
        check_owner_exit(scenario, it, fault.signalled)


def _watch(
    scenario: Scenario,
    it: Iteration,
    proc: subprocess.Popen[bytes],
    job: Job,
    events: str,
    fault: FaultInjector,
    t_start: float,
    abort: threading.Event | None,
) -> float | None:
    """Tick (the probe's events, the fault, memory) until every process of the job is gone,
    and return when (``time.time()``); None when the owner hangs past the deadline, the rest
    of the job lingers past ``LINGER_LIMIT`` after it, or ``abort`` is set (``it.aborted``)."""
    deadline = t_start + scenario.deadline
    owner_gone: float | None = None
    seen_events = 0
    ready = False
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
        _sample_memory(it, alive, proc.pid)
        if owner_gone is None and proc.poll() is not None:
            owner_gone = now
            it.owner_exit = proc.returncode
        if owner_gone is not None and not alive:
            return time.time()
        if owner_gone is None and now > deadline:
            it.hang = True
            it.problems.append(f"hang: still running after its {scenario.deadline:.0f}s deadline")
            dump_stacks(job, pathlib.Path(it.directory) / "hang-stacks.txt")
            return None
        if owner_gone is not None and now > min(deadline, owner_gone + LINGER_LIMIT):
            return None
        if abort is not None and abort.is_set():
            it.aborted = True
            return None
        time.sleep(_TICK)


def _sample_memory(it: Iteration, alive: list[psutil.Process], owner_pid: int) -> None:
    for p in alive:
        role = role_of(p, owner_pid)
        try:
            rss = p.memory_info().rss / 2**20
        except psutil.Error:
            continue
        it.peak_rss_mb[role] = round(max(it.peak_rss_mb.get(role, 0.0), rss), 1)


def _stop_what_is_left(it: Iteration, proc: subprocess.Popen[bytes], job: Job) -> None:
    left = job.processes()
    it.leftover_processes = [describe_process(p) for p in left]
    if left and not it.hang:
        it.problems.append(f"left behind: {it.leftover_processes}")
    if proc.poll() is None:  # never killpg a reaped owner's pid: it may be reused
        killpg(proc.pid)
    job.signal_all(signal.SIGKILL)


def _read_outcome(
    scenario: Scenario,
    it: Iteration,
    fault: FaultInjector,
    events: str,
    wall_start: float,
    all_gone_at: float | None,
) -> None:
    """When the fault landed and the job ended, and what the program's probe events say
    about them (the job has ended: the events file is read whole)."""
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
