"""The processes of one soak iteration's job: found by the marker in their environment
(``jobenv``), told apart by role (owner, logger, wandb-core, worker), signalled, their stacks
dumped when the job hangs, and all of them killed at the end (``end_job``)."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import psutil

from wandb_funnel.soak.iteration import Iteration
from wandb_funnel.soak.jobenv import MARK_VAR, describe, marked_processes

END_JOB_WAIT = 5.0  # for SIGKILLed processes to be gone (a stopped one is killed too)


def ppid_of(proc: psutil.Process) -> int | None:
    try:
        return int(proc.ppid())
    except psutil.Error:
        return None


def role_of(proc: psutil.Process, owner_pid: int) -> str:
    if proc.pid == owner_pid:
        return "owner"
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:  # gone meanwhile
        return "worker"
    if "wandb_funnel._logger" in cmd:
        return "logger"
    if "wandb_funnel._node" in cmd:  # a node logger (issue 38): never a "worker"
        return "node-logger"
    if "wandb-core" in cmd:
        return "wandb-core"
    return "worker"


# Never the "worker" a kill-worker fault means: multiprocessing's own helper processes, the
# ones wandb-core starts (its system monitor), and git, which wandb runs for the run's
# metadata (wandb 0.22: `git cat-file --batch-check` lives as long as the run).
_HELPERS = (
    "multiprocessing.resource_tracker",
    "multiprocessing.forkserver",
    "multiprocessing.semaphore_tracker",
    "wandb-symon",
    "gpu_stats",
)
_HELPER_NAMES = frozenset({"git"})


def is_helper(proc: psutil.Process) -> bool:
    try:
        cmd = " ".join(proc.cmdline())
        name = proc.name()
    except psutil.Error:
        return True  # gone meanwhile: not a target either
    return name in _HELPER_NAMES or any(h in cmd for h in _HELPERS)


class Job:
    """The processes of one iteration, found by marker; scanning is cached by pid."""

    def __init__(self, mark: str, owner: subprocess.Popen[bytes]) -> None:
        self.mark, self.owner, self.owner_pid = mark, owner, owner.pid
        self._known: dict[tuple[int, float], bool] = {}

    def processes(self) -> list[psutil.Process]:
        return marked_processes(self.mark, MARK_VAR, self._known)

    def by_role(self, role: str) -> list[psutil.Process]:
        return [p for p in self.processes() if role_of(p, self.owner_pid) == role]

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
                reached.append(f"{role_of(proc, self.owner_pid)}:{proc.pid}")
            except psutil.Error:
                pass
        return reached


def end_job(job: Job, it: Iteration) -> None:
    """SIGKILL every process of the job until a scan finds none (bounded): one scan misses a
    process forked after it started, or one whose environment was unreadable for a moment.
    A process still there after that fails the iteration."""
    if job.owner.poll() is None:  # never killpg a reaped owner's pid: it may be reused
        killpg(job.owner_pid)
    deadline = time.monotonic() + END_JOB_WAIT
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
    survivors = [describe_process(p) for p in left]
    if job.owner.poll() is None:
        survivors.append(f"{job.owner_pid} (the owner)")
    if survivors:
        it.problems.append(f"survived SIGKILL for {END_JOB_WAIT:.0f}s: {survivors}")


def dump_stacks(job: Job, path: pathlib.Path) -> None:
    """Where a hung job is stuck: every process's Python stacks, when py-spy is installed."""
    spy = shutil.which("py-spy") or str(pathlib.Path(sys.executable).with_name("py-spy"))
    if not os.path.exists(spy):
        return
    with open(path, "w") as out:
        for proc in job.processes():
            out.write(f"==== {describe_process(proc)}\n")
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


def pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def describe_process(proc: psutil.Process) -> str:
    return describe(proc, 100)
