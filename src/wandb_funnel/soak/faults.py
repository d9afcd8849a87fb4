"""A scenario's fault, injected into a running job (``FaultInjector``): when it lands (after
the program's ``ready`` event, or after the start) and what it does (the actions listed in
``scenarios``: signals to the owner's group or the whole job, one process killed or
wandb-core stopped)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable

import psutil

from wandb_funnel.soak.job import Job, is_helper, killpg, pgid_of, ppid_of, role_of
from wandb_funnel.soak.scenarios import Scenario

__all__ = ["FaultInjector"]


class FaultInjector:
    """Injects a scenario's fault after a random delay: from the program's ``ready`` event,
    or, for a program that does not use the probe (``Fault.needs_probe=False``), from its
    start."""

    def __init__(
        self,
        scenario: Scenario,
        job: Job,
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
        elif action == "kill-node-logger":
            return self._kill_one("node-logger")
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
                f"{role_of(p, self.job.owner_pid)}:{p.pid}"
                for p in self.job.processes()
                if pgid_of(p.pid) == self.owner.pid
            ]
            killpg(self.owner.pid)

    def _kill_one(self, role: str) -> bool:
        candidates = [p for p in self.job.by_role(role) if p.pid not in self.hit]
        if role == "wandb-core":
            # The run's wandb-core: the logger's own (the owner's, started by wandb.setup()
            # before any process, holds no run of the funnel's).
            loggers = {p.pid for p in self.job.by_role("logger")}
            of_logger = [p for p in candidates if ppid_of(p) in loggers]
            candidates = of_logger or candidates
        if role == "worker":
            announced = [p for p in candidates if p.pid in self.worker_pids]
            # A program that announces no worker (a user's) may lose any of its processes.
            if announced or self.spec is None or self.spec.needs_probe:
                candidates = announced
            else:
                candidates = [p for p in candidates if not is_helper(p)]
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
