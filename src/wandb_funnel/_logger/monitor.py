"""Monitor: rank health, ``status.json``, the stacks of ranks behind, and a close's progress.

It watches what the loop hands it (each batch's ranks and steps, each row's values, the
spread of a key) through ``Health`` (pure logic), and says what it finds on the terminal
and in the run's console. It never writes rows: a report must never cost the run anything,
and a stack is taken on a thread of its own (py-spy, bounded), so the writer never waits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wandb_funnel import _private_dir
from wandb_funnel._logger.health import Health
from wandb_funnel._logger.pacing import Pacer
from wandb_funnel._logger.say import log_to_stderr

if TYPE_CHECKING:
    from wandb_funnel._deadline import Deadline
    from wandb_funnel._logger.ordering import Row
    from wandb_funnel._logger.receiver import Receiver
    from wandb_funnel.sinks import Sink

_HEALTH_PERIOD = 1.0  # seconds between looks for a stall (and status.json rewrites)
_STATUS_SHARE = 0.03  # of the logger's time, at most, for status.json
_SILENT_AFTER = 10.0  # wandb-funnel status: a rank with no record this long is "silent"
_CLOSE_QUIET = 2.0  # a close says how far it got once it has taken this long, every second
_STACK_TIMEOUT = 10.0  # seconds py-spy may take for one rank's stack


class Monitor:
    """The logger's eyes on its ranks. Main thread only, but for the stacks' thread."""

    def __init__(
        self,
        stall_timeout: float,
        receiver: Receiver,
        directory: str | None,
        local_ranks: bool,
        about: dict[str, Any],
    ) -> None:
        self.health = Health(stall_timeout)  # stalls, NaNs, stragglers
        self._receiver = receiver
        self._dir = directory
        self._local_ranks = local_ranks  # every rank's pid is ours to see (py-spy)
        # run_id, owner_pid, started (and a restarted job's attempt): what status.json says
        self._about = about
        self.pids: dict[int, int] = {}  # rank -> its process, as it said at attach
        # The run's console, once it is open and while its wandb-core answers.
        self.console: Callable[[], Sink | None] = lambda: None
        self._next_health = 0.0
        self._status_pacer = Pacer(_STATUS_SHARE, _HEALTH_PERIOD)
        self._next_progress = 0.0
        self._close_progress: dict[str, Any] | None = None  # while closing: rows/seconds left

    # -- what the loop tells it ----------------------------------------------------------------
    def attached(self, rank: int, pid: int, now: float) -> None:
        self.health.attached(rank, now)
        self.pids[rank] = pid

    def batch(self, rank: int, top: int | None, count: int, now: float) -> None:
        self.health.batch(rank, top, count, now)

    def rows(self, rows: list[Row]) -> None:
        """Each released row's values: the first NaN or Inf of a (rank, key) is said."""
        health = self.health
        for row in rows:
            for rank, part in row.parts.items():
                for line in health.values(rank, row.step, part):
                    self.say(line)

    def folded_nonfinite(self, count: int, said: list[list[Any]]) -> None:
        """What a node logger found non-finite among the values it pre-reduced."""
        for line in self.health.folded_values(count, said):
            self.say(line)

    def spread(self, key: str, ranks: list[int], values: list[Any], step: int) -> None:
        """The ``spread`` reducer's values of a key at a step: a straggler is said."""
        line = self.health.spread(key, ranks, values, step)
        if line is not None:
            self.say(line)

    def tick(self, now: float, active: set[int], status: Callable[[float], dict[str, Any]]) -> None:
        """Once a ``_HEALTH_PERIOD``: look for a stall, and rewrite ``status.json``; less
        often when writing it costs more than ``_STATUS_SHARE`` of the time (its ranks'
        entries: 16,384 ranks took tens of ms a write, issue 38)."""
        if now < self._next_health:
            return
        self._next_health = now + _HEALTH_PERIOD
        self._look_for_stalls(now, active)
        if self._status_pacer.due(now):
            began = time.monotonic()
            self.write_status(now, status)
            self._status_pacer.ran(now, began)

    # -- saying it -----------------------------------------------------------------------------
    def say(self, text: str) -> None:
        """A health report: on the terminal (stderr) and in the run's console."""
        log_to_stderr(text)
        console = self.console()
        if console is None:
            return
        try:
            console.output("stderr", f"wandb-funnel: {text}\n", time.time())
        except Exception:
            pass  # the terminal has it; a console record must never cost a row

    def _look_for_stalls(self, now: float, active: set[int]) -> None:
        found = self.health.check(now, active)  # a dead rank has left active
        if found is None:
            return
        kind, text = found
        self.say(text)
        if kind == "resumed":
            return
        behind = [(r, self.pids.get(r)) for r in self.health.behind]
        threading.Thread(
            target=self._say_stacks, args=(behind,), name="wandb-funnel-stacks", daemon=True
        ).start()

    def _say_stacks(self, behind: list[tuple[int, int | None]]) -> None:
        """The lagging ranks' Python stacks, by py-spy when it is installed (bounded)."""
        beside = os.path.join(os.path.dirname(sys.executable), "py-spy")  # the venv's bin
        spy = shutil.which("py-spy") or (beside if os.access(beside, os.X_OK) else None)
        for rank, pid in behind:
            if not pid or not self._local_ranks:
                continue
            if spy is None:
                self.say(
                    f"rank {rank}'s Python stack: pip install py-spy, then py-spy dump --pid {pid}"
                )
                continue
            try:
                done = subprocess.run(
                    [spy, "dump", "--pid", str(pid)],
                    capture_output=True,
                    text=True,
                    timeout=_STACK_TIMEOUT,
                    check=False,
                )
                stack = (done.stdout or done.stderr).strip()
            except (OSError, subprocess.TimeoutExpired) as exc:
                stack = f"py-spy failed: {exc!r}"
            self.say(f"rank {rank} (pid {pid}), py-spy dump:\n{stack[:8000]}")

    # -- status.json ---------------------------------------------------------------------------
    def status(
        self, now: float, stats: dict[str, Any], pending_rows: int, closing: bool
    ) -> dict[str, Any]:
        """What ``wandb-funnel status`` shows (``_status.py``), from counters at hand."""
        info = self._receiver.run_info or {}
        ranks = []
        for peer in sorted(self._receiver.streams.snapshot(), key=lambda p: p["rank"]):
            progress = self.health.ranks.get(peer["rank"])
            last = progress.last_record if progress is not None else None
            since = None if last is None else round(now - last, 1)
            if peer["gone"]:
                state = "dead"
            elif peer["ended"]:
                state = "finished"
            elif peer["rank"] in self.health.behind or since is None or since >= _SILENT_AFTER:
                state = "silent"
            else:
                state = "alive"
            ranks.append(
                {
                    "rank": peer["rank"],
                    "pid": peer["pid"],
                    "host": peer["host"],
                    "state": state,
                    "last_step": progress.last_step if progress is not None else -1,
                    "since_last_s": since,
                    "records": peer["received"],
                    "dropped": peer["dropped"],
                    "steps_per_s": round(progress.steps_per_s(now), 2) if progress else 0.0,
                }
            )
        about = self._about
        nodes = self._receiver.nodes
        return {
            "run_id": about["run_id"],
            "name": info.get("name"),
            "project": info.get("project"),
            "owner_pid": about["owner_pid"],
            "logger_pid": os.getpid(),
            "started": about["started"],
            "state": "closing" if closing else "running",
            "rows": stats["_funnel/rows"],
            "pending_rows": pending_rows,
            "dropped": stats["_funnel/dropped_records"],
            "close": self._close_progress,
            "attempt": about.get("attempt"),  # a restarted job's attempt (_logger/attempt.py)
            "updated": time.time(),
            "ranks": ranks,
            # the node tier (issue 38): each node, its node logger's pid, its ranks
            **({"nodes": nodes.snapshot(now)} if nodes.tiered else {}),
        }

    def write_status(self, now: float, status: Callable[[float], dict[str, Any]]) -> None:
        try:
            data = status(now)
        except Exception as exc:  # a status must never cost the run anything
            log_to_stderr(f"could not write status.json: {exc!r}")
            return
        _private_dir.write_json(self._dir, _private_dir.STATUS, data)

    # -- a close's progress --------------------------------------------------------------------
    def close_progress(
        self, rows_left: int, close: Deadline, status: Callable[[float], dict[str, Any]]
    ) -> None:
        """While a close writes rows: past ``_CLOSE_QUIET`` seconds, once a second, how many
        rows are left and how much of the budget (on the terminal, as wandb's finish says
        its upload's progress), and the same in status.json."""
        now = time.monotonic()
        left = close.remaining()
        self._close_progress = {"rows_left": rows_left, "seconds_left": round(left, 1)}
        if now < self._next_progress:
            return
        self._next_progress = now + 1.0
        self.write_status(now, status)
        if close.elapsed() >= _CLOSE_QUIET:
            log_to_stderr(f"closing: {rows_left} rows left to write, {left:.1f}s left")
