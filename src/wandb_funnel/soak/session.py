"""One soak: its iterations run round-robin on ``--jobs`` threads (plain-wandb programs
first), a line printed per iteration, Ctrl-C and SIGTERM handled (the first stops, the second
aborts), then the table written (``report``). ``wandb-funnel soak``'s options come from its
command line (``wandb_funnel._soak_command``)."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import pathlib
import shlex
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from wandb_funnel.soak import harness, report
from wandb_funnel.soak.harness import Iteration
from wandb_funnel.soak.scenarios import Scenario

__all__ = ["soak"]


def soak(args: argparse.Namespace, chosen: list[Scenario], full_argv: list[str]) -> int:
    """Run ``chosen`` as the options in ``args`` say; the exit code: 1 when an iteration
    failed, 128 + the signal when a second one aborted the soak, else 0."""
    missing = [s for s in chosen if any(importlib.util.find_spec(m) is None for m in s.needs)]
    for s in missing:
        print(f"not run: {s.name} needs {', '.join(s.needs)}", file=sys.stderr)
    session = _Session(args, [s for s in chosen if s not in missing])
    session.run()
    return session.write_table(full_argv)


class _Session:
    def __init__(self, args: argparse.Namespace, chosen: list[Scenario]) -> None:
        self.args, self.chosen = args, chosen
        self.user = bool(args.target)
        self.out = pathlib.Path(args.out)
        self.runs_dir = self.out / "iterations"
        self.seed = args.seed or datetime.datetime.now().strftime("%Y%m%d%H%M%S")
        self.started, self.t0 = datetime.datetime.now(datetime.timezone.utc), time.monotonic()
        self.stop_at = self.t0 + args.minutes * 60 if args.minutes else None
        self.counts = dict.fromkeys((s.name for s in chosen), 0)
        self.plain_counts = dict.fromkeys((s.name for s in chosen if s.plain), 0)
        self.done: list[Iteration] = []
        self.aborted = 0  # iterations whose jobs a second Ctrl-C killed: not judged
        self.lock = threading.Lock()
        self.stopping, self.aborting = threading.Event(), threading.Event()
        self.abort_signal = signal.SIGINT  # the signal that aborted: the exit code says which
        self.said: set[str] = set()

    def stop(self, signum: int, frame: object) -> None:
        # First Ctrl-C or SIGTERM: no new iterations; the running ones finish and the table
        # is written. A second one: the running iterations' jobs are killed (those are left
        # out of the table), then the table is written. A third Ctrl-C interrupts as usual.
        # Flags only: the main loop says what they mean (a handler that prints can land
        # inside another write to stderr; suspected, not shown, where a second Ctrl-C's
        # message never came in 2 of 3 full-tier runs: docs/DESIGN.md, "Known open problems").
        if self.aborting.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.stopping.is_set():
            self.abort_signal = signal.Signals(signum)
            self.aborting.set()
            return
        self.stopping.set()

    def say_what_the_signals_asked(self) -> None:
        if self.stopping.is_set() and "stopping" not in self.said:
            self.said.add("stopping")
            print(
                "stopping: finishing the running iterations, then writing the table "
                "(again to abort them)",
                file=sys.stderr,
                flush=True,
            )
        if self.aborting.is_set() and "aborting" not in self.said:
            self.said.add("aborting")
            print(
                "aborting: killing the running iterations, then writing the table",
                file=sys.stderr,
                flush=True,
            )

    def next_job(self) -> tuple[Scenario, int, bool] | None:
        args, counts, plain_counts = self.args, self.counts, self.plain_counts
        with self.lock:
            if self.stopping.is_set():
                return None
            # The plain-wandb programs first: they are few, and some of them hang.
            for s in sorted(
                (s for s in self.chosen if s.plain), key=lambda s: plain_counts[s.name]
            ):
                if plain_counts[s.name] < args.plain:
                    plain_counts[s.name] += 1
                    return s, plain_counts[s.name], True
            if self.stop_at is not None and time.monotonic() >= self.stop_at:
                return None
            pending = [s for s in self.chosen if args.minutes or counts[s.name] < args.iterations]
            if not pending:
                return None
            s = min(pending, key=lambda s: counts[s.name])
            counts[s.name] += 1
            return s, counts[s.name], False

    def work(self, job: tuple[Scenario, int, bool]) -> Iteration:
        scenario, index, plain = job
        it_seed = f"{self.seed}-{scenario.name}-{index}"
        try:
            it = harness.run_iteration(
                scenario, index, self.runs_dir, it_seed, plain, self.aborting
            )
        except Exception as exc:  # before its job started (its directory): fails this one only
            it = Iteration(
                scenario.name, index, it_seed, plain, problems=[f"harness error: {exc!r}"]
            )
        if it.aborted:
            print(
                f"{scenario.name} #{index}: aborted (its job killed; not in the table)", flush=True
            )
            if not self.args.keep:
                shutil.rmtree(it.directory, ignore_errors=True)
            return it
        self._say(it, scenario, index, plain)
        if it.ok and not self.args.keep:
            shutil.rmtree(it.directory, ignore_errors=True)
        return it

    def _say(self, it: Iteration, scenario: Scenario, index: int, plain: bool) -> None:
        """The iteration's line: what a user's command did, or a matrix scenario's balance."""
        status = "ok" if it.ok else "FAILED: " + "; ".join(it.problems)
        if self.user:
            fault = (
                ""
                if not it.fault
                else (f"fault at {it.fault_at_s}s, " if it.fault_done else "fault missed, ")
            )
            exit_s = f"exit {it.exit_s}s after it, " if it.exit_s is not None else ""
            balance = f", sent {it.sent} logged {it.logged} lost {it.lost}" if it.probe_used else ""
            print(
                f"{scenario.name} #{index}: owner exit {'hang' if it.hang else it.owner_exit}, "
                f"{fault}{exit_s}job {it.duration_s}s, run exit records {it.run_exits}, "
                f"dropped {it.dropped}{balance}; {status}",
                flush=True,
            )
        else:
            kind = " (plain wandb)" if plain else ""
            print(
                f"{scenario.name}{kind} #{index}: exit {it.owner_exit}, "
                f"{it.exit_s}s, sent {it.sent} logged {it.logged} dropped {it.dropped} "
                f"{status}",
                flush=True,
            )

    def run(self) -> None:
        """Every iteration, ``--jobs`` at a time, until done, stopped or aborted."""
        jobs = self.args.jobs
        handlers = {s: signal.signal(s, self.stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            with ThreadPoolExecutor(jobs) as pool:
                running: set[Future[Iteration]] = set()
                try:
                    while True:
                        while len(running) < jobs and (job := self.next_job()) is not None:
                            running.add(pool.submit(self.work, job))
                        self.say_what_the_signals_asked()
                        if not running:
                            break
                        # With a timeout: a signal the kernel hands to another thread does
                        # not wake a lock wait of the main thread, which alone runs the
                        # handler.
                        finished, running = wait(running, timeout=0.2, return_when=FIRST_COMPLETED)
                        self.done.extend(it for f in finished if not (it := f.result()).aborted)
                        self.aborted += sum(f.result().aborted for f in finished)
                except BaseException:
                    # A third Ctrl-C, or a bug here: set before the executor's exit waits for
                    # the running iterations, so they kill their jobs (checked each tick) at
                    # once.
                    self.aborting.set()
                    raise
        finally:
            for signum, handler in handlers.items():  # the caller's (a test's) handlers again
                signal.signal(signum, handler)

    def write_table(self, full_argv: list[str]) -> int:
        """The table (terminal, ``soak.md``, ``soak.json``); returns the exit code."""
        args, done, out = self.args, self.done, self.out
        rows = report.summarize(sorted(done, key=lambda i: (i.scenario, i.plain, i.index)))
        if self.user:  # the faults in the order they were asked for, not by name
            order = {s.name: n for n, s in enumerate(self.chosen)}
            rows.sort(key=lambda row: order.get(row["scenario"], len(order)))
        columns = report.user_columns(rows) if self.user else report.COLUMNS
        header: dict[str, Any] = {
            "date": self.started.strftime("%Y-%m-%d %H:%M UTC"),
            "duration_min": round((time.monotonic() - self.t0) / 60, 1),
            "stopped_early": self.stopping.is_set(),
            "aborted_iterations": self.aborted,
            "iterations": sum(1 for i in done if not i.plain),
            "plain_iterations": sum(1 for i in done if i.plain),
            "jobs": args.jobs,
            "seed": self.seed,
            "machine": report.machine(),
            "command": "wandb-funnel " + shlex.join(full_argv),
            "target": shlex.join(args.target) if self.user else None,
            "matrix": str(pathlib.Path(args.matrix).resolve()) if args.matrix else None,
        }
        report.write(out, rows, header, done, columns)
        print()
        print(report.text(rows, columns) if rows else "(no iterations)")
        failed = sum(row["failed"] for row in rows)
        killed = f", {self.aborted} aborted" if self.aborted else ""
        print(
            f"\n{header['iterations']} iterations, {failed} failed{killed}; "
            f"table in {out / 'soak.md'} and {out / 'soak.json'}"
        )
        if failed:
            return 1
        # As a shell reports the signal's exit.
        return 128 + self.abort_signal if self.aborted else 0
