"""The logger process: events -> order -> sink, and always finish the run.

Started by the owner (``_owner.logger_process.LOGGER_BOOTSTRAP``, in a session of its own so that a
terminal's Ctrl-C or a launcher's killpg reaches the owner, which then closes us in order).
A receiver thread (``_receiver``) owns the socket; this main thread merges, orders and writes
rows to wandb, which may be slow. It ends when the owner sends CLOSE, when it is signalled
directly, or when the owner vanishes (it polls its parent pid): in each case it waits,
bounded, for ranks still sending, writes every buffered row, records the accounting in the
summary and finishes the run. A watchdog ends the process if wandb stalls past the budget.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from wandb_funnel._constants import (
    BATCH_BYTES,
    ENV_WARM,
    EXIT_LOGGER_RESTART,
    EXIT_OWNER_LOST,
    EXIT_RANK_DIED,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    FINAL_STATS,
    LOGGER_TICK,
    MEDIA_DIR,
    RUN_INFO_FILE,
    STATUS_FILE,
)
from wandb_funnel._logger import continuity
from wandb_funnel._logger.continuity import Continuation, RunData
from wandb_funnel._logger.health import Health
from wandb_funnel._logger.media import MediaFiles, count_media
from wandb_funnel._logger.ordering import Reorderer
from wandb_funnel._logger.receiver import (
    Attached,
    Ended,
    Event,
    Receiver,
    Records,
    Update,
    log_to_stderr,
)
from wandb_funnel._logger.reduce import RowBuilder
from wandb_funnel._logger.run_writer import RunWriter
from wandb_funnel._logger.saving import SaveTracker
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import Done, LoggerStart, UpdateKind
from wandb_funnel._protocol.sockets import LoggerSocket, remove_ipc_dir
from wandb_funnel.sinks import (
    Opening,
    Sink,
    open_sink,
    opens_online,
    shut_down_own_service,
    warm_up,
)

_PEER_RCV_HWM = 250  # frames queued per peer inside ZeroMQ (up to 64,000 records)
_MAX_QUEUED_RECORDS = 500_000  # records decoded and waiting for the writer: bounds memory
_EVENTS_PER_WAKE = 125  # events (up to 32,000 records) taken before released rows are written
# Rows written per wake-up (about 0.2 s of wandb.log): the loop comes back often enough to
# see a CLOSE, a signal or a dead owner even with a long backlog of rows.
_ROWS_PER_WAKE = 1_000
_SIGNAL_BUDGET = 5.0  # seconds to finish when the logger itself is signalled
# Of the close budget, this much is kept for the summary and wandb's finish: rows that do not
# fit before it are counted as dropped, so the run always gets its accounting and exit code.
_FINISH_RESERVE = 2.0
# Once closing, the logger exits by itself this long after its budget, whatever wandb does:
# nobody else may be left to kill it (the owner may be dead).
_WATCHDOG_GRACE = 1.0
_SAVE_PERIOD = 0.2  # seconds between looks at what the transaction log holds
_HEALTH_PERIOD = 1.0  # seconds between looks for a stall (and status.json rewrites)
_SILENT_AFTER = 10.0  # wandb-funnel status: a rank with no record this long is "silent"
_CLOSE_QUIET = 2.0  # a close says how far it got once it has taken this long, every second
_STACK_TIMEOUT = 10.0  # seconds py-spy may take for one rank's stack


class SinkLostError(Exception):
    """This logger cannot go on (its wandb-core died): the owner starts a new one."""


def run_exit_code(owner_code: int, rank_codes: list[int]) -> int:
    """The run's exit code, from the owner's and the failed ranks' (in the order they ended).

    A rank that raised fails the run even when the owner ended cleanly. When the owner was
    only stopped by a signal, a rank's own failure is the cause and names it: torchrun sends
    SIGTERM to every other rank once one rank fails, so the owner's 143 is the consequence.
    """
    signalled = (EXIT_SIGINT, EXIT_SIGTERM)
    causes = [code for code in rank_codes if code not in signalled]
    if owner_code in (0, *signalled) and causes:
        return causes[0]
    return owner_code or next(iter(rank_codes), 0)


class Logger:
    """One funnel's writer: routes the receiver's events to writers (one wandb run each)."""

    def __init__(
        self,
        start: LoggerStart,
        receiver: Receiver,
        open_sink: Callable[..., Sink],
        before: Continuation | None = None,
    ) -> None:
        self._options = start.options
        # What the loggers before this one left (a restart), and what this one leaves.
        self._before = before or Continuation.empty()
        self._run_data = RunData(self._before.run_data)
        # Resent records whose rows the dead logger wrote after its last state: the run's,
        # and counted here (its state could not count them).
        self._duplicates = 0
        # rank -> end of the records taken in; on disk before any row holding them is written
        self._taken: dict[int, int] = {}
        self._taken_on_disk: dict[int, int] = {}
        self._taken_note = continuity.TakenNote(start.ipc_dir, self._before.generation)
        self._next_save = 0.0
        self._health = Health(start.options.stall_timeout)  # stalls, NaNs, stragglers
        self._started = float((start.program or {}).get("start_time") or time.time())
        self._close_progress: dict[str, Any] | None = None  # while closing: rows/seconds left
        self._next_progress = 0.0
        self._next_health = 0.0
        self._local_ranks = start.topology.tcp_host is None  # every rank's pid is ours to see
        self._supervised = True  # the owner is alive: it restarts a logger that exits
        self._orphaned = False  # the owner is gone: serve the ranks until they all end
        self._owner_pid = start.owner_pid
        self._close_timeout = start.options.close_timeout
        self._ipc_dir = start.ipc_dir
        self._receiver = receiver
        self._open_sink = open_sink
        self._per_rank = start.topology.per_rank  # run_mode="new": a run per rank
        self._run_id = start.run_id
        self._expected_ranks = start.topology.expected_ranks
        self._writers: dict[int | None, RunWriter] = {}
        if self._per_rank is not None:
            receiver.run_info = {}  # no one run to tell the ranks about
        self._watching = False
        self._active: set[int] = set()  # ranks attached and not yet finished or gone
        self._ended_ranks: set[int] = set()  # ranks that finished or are gone
        self._failed: dict[int, int] = {}  # rank -> the non-zero exit code it reported
        self._pids: dict[int, int] = {}  # rank -> its process, as it said at attach
        self._closing: tuple[int, float, str] | None = None  # (exit code, straggler deadline, why)
        self._write_deadline: float | None = None  # when closing: rows stop, finish goes on
        self._close_clock: tuple[float, float] | None = None  # when closing: (start, budget)
        self._close = receiver.close_requests  # every cause of a close asks here
        self._watchdog_lock = threading.Lock()
        self._watchdog_armed = False
        self.final_stats: dict[str, Any] | None = None

    def _new_writer(self, sink: Sink | None, name: str) -> RunWriter:
        options = self._options
        mode = "shared" if options.run_mode == "shared" else "auto"
        staging = os.path.join(self._ipc_dir, MEDIA_DIR) if self._ipc_dir else None
        warn = _warn_once(name)
        writer = RunWriter(
            sink,
            Reorderer(options.reorder_window, options.max_pending_rows),
            RowBuilder(mode, options.reduce, options.step_key, warn, self._on_spread),
            name,
            MediaFiles(staging, warn),
            options.step_key,
        )
        writer.saves = SaveTracker(self._before.saved if name == self._run_id else None)
        if sink is not None:  # a resumed run's rows start past its last one
            writer.steps.next_step = sink.starting_step
        return writer

    def _writer_for(self, rank: int) -> RunWriter:
        """The writer rank's records go to (in run_mode="new", its own run, opened now)."""
        if self._per_rank is None:
            return self._writers[None]
        writer = self._writers.get(rank)
        if writer is None:
            per = self._per_rank
            names = per.names(rank)
            run_id = per.id_template.format(**names)
            sink: Sink | None
            try:
                # wandb-core samples the rank's own process for its run, as plain wandb's
                # per-rank runs do (x_stats_pid).
                sink = self._open_sink(
                    {"id": run_id, "group": per.group_template.format(**names)},
                    self._pids.get(rank),
                )
            except Exception as exc:
                log_to_stderr(f"could not open run {run_id!r} for rank {rank}: {exc!r}")
                sink = None
            writer = self._writers[rank] = self._new_writer(sink, run_id)
        return writer

    def open_run(self, opening: Opening) -> None:
        """Open the one run (not in run_mode="new": those open as their ranks attach), then
        tell the ranks its name and directory. Until it is open, the ranks' records wait in
        the receiver's queue (bounded: past it they are counted as dropped).

        Raises:
            Exception: the run could not be opened (``opening`` says whether a server that
                does not answer raises, or means an offline run).
        """
        if self._per_rank is not None:
            return
        try:
            sink: Sink | None = self._open_sink({}, None, opening)
        except Exception as exc:
            if not self._watching:
                raise  # at start, in the foreground: the owner's start raises it
            if self._supervised and self._close.first() is None:
                # In the background (online), wandb-core died or wandb failed under us: the
                # owner starts a new logger, which opens the run again (bounded restarts).
                log_to_stderr(f"could not open the run: {type(exc).__name__}: {exc}; exiting")
                raise SinkLostError from exc
            # In the background the owner has returned long ago: the ranks' records are
            # counted as dropped, and the run's absence is said once.
            log_to_stderr(f"could not open the run: {type(exc).__name__}: {exc}")
            log_to_stderr("every record the ranks send is counted as dropped")
            sink = None
        writer = self._writers[None] = self._new_writer(sink, self._run_id)
        if sink is not None and self._before.generation:
            self._continue_run(writer)
        # A launched job's ranks are known before they attach: rows wait for them from
        # the start (within the first window), so ranks that start a little later still
        # merge, and ranks that never call wandb cost that one window, not one a row.
        for rank in (*self._expected_ranks, *self._before.active):
            writer.order.rank_expected(rank)
        info = self._receiver.run_info = self.run_info()
        continuity.write_json(self._ipc_dir, RUN_INFO_FILE, info)
        # A successor must know this segment even if this logger dies before its first row
        # is saved (it then reads the segment from its start).
        self._write_state()

    def _continue_run(self, writer: RunWriter) -> None:
        """A restarted logger's run: the config, summary, metric definitions and name,
        notes and tags the ranks gave the dead one, then one line in the run's console that
        says what happened."""
        data = self._run_data
        if data.config:
            writer.update(UpdateKind.CONFIG, dict(data.config))
        for metric in data.metrics:
            writer.update(UpdateKind.METRIC, dict(metric))
        if data.summary:
            writer.update(UpdateKind.SUMMARY, dict(data.summary))
        if data.run:  # run.name / notes / tags: the new segment's run record says them too
            writer.update(UpdateKind.RUN, dict(data.run))
        before = self._before
        # The run's _step goes on past the dead logger's last row: a row below it is late.
        writer.steps.next_step = max(writer.steps.next_step, before.next_step)
        line = (
            f"wandb-funnel: the logger was restarted (restart {before.generation}); the run "
            f"continues in a new segment; {before.rows} rows are in the earlier ones\n"
        )
        if writer.sink is not None:
            try:
                writer.sink.output("stderr", line, time.time())
            except Exception as exc:
                log_to_stderr(f"could not note the restart in the run's console: {exc!r}")

    def watch(self) -> None:
        """Take signals and watch the owner from now on: a close may come while the run is
        still opening (``open_run`` stops waiting for the network then)."""
        if self._watching:
            return
        self._watching = True
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        threading.Thread(target=self._watch_owner, name="wandb-funnel-owner", daemon=True).start()

    def open_by(self) -> float | None:
        """None until anything asks the funnel to close (the owner, a signal, its death);
        then the time by which a run still opening must be open: the half of the close's
        budget that waits for stragglers (the other half writes the rows and finishes)."""
        asked = self._close.first()
        if asked is None:
            return None
        budget = self._close_timeout if asked.budget is None else asked.budget
        return asked.at + max(0.0, budget) / 2

    def run_info(self) -> dict[str, Any]:
        """What the run told about itself when it opened (empty in run_mode="new")."""
        writer = self._writers.get(None)
        if writer is None or writer.sink is None:
            return {}
        try:
            return writer.sink.info()
        except Exception as exc:
            log_to_stderr(f"could not read the run's name and directory: {exc!r}")
            return {}

    # -- the loop ------------------------------------------------------------------------------
    def serve(self) -> int:
        """Run until closed; returns the exit code the run was finished with."""
        self.watch()
        more_rows = False
        window_applies = True
        while True:
            now = time.monotonic()
            # A row's deadline only matters while the window can apply: waiting 0 for one that
            # cannot fire spun this loop, holding the GIL from the receiver it waits for.
            deadlines = [
                d
                for c in self._writers.values()
                if window_applies and (d := c.order.next_deadline())
            ]
            wait = min([LOGGER_TICK, *(max(0.0, d - now) for d in deadlines)])
            caught_up = self._take_events(0.0 if more_rows else wait, _EVENTS_PER_WAKE)
            now = time.monotonic()
            # While events are still queued, or frames still wait unread in the socket, the
            # logger is behind: a row's window may have run out while the straggler's records
            # wait in a queue, so rows wait for floors (or the memory bound) until it has
            # caught up (docs/DESIGN.md, "Windows apply only when caught up").
            window_applies = caught_up and self._receiver.socket_drained(now)
            more_rows = False
            for writer in self._writers.values():
                if not writer.finished:
                    rows = writer.order.pop_ready(now, window_applies, _ROWS_PER_WAKE)
                    if rows:
                        self._note_taken()
                    self._look_at_values(rows)
                    writer.write(rows, self._write_deadline)
                    more_rows |= len(rows) >= _ROWS_PER_WAKE
                    writer.saves.written(
                        writer.order.last_released_step, writer.rows, writer.records
                    )
            self._note_saved(now)
            if now >= self._next_health:
                self._next_health = now + _HEALTH_PERIOD
                self._look_for_stalls(now)
                self._write_status(now)
            # A close already asked (a signal that reached wandb-core too, as scancel's does)
            # is not given up for a restart: the job is ending, and a new logger would not
            # start within a scheduler's grace.
            if (
                self._supervised
                and self._closing is None
                and self._close.first() is None
                and self._sink_lost()
            ):
                return EXIT_LOGGER_RESTART
            if self._orphaned and self._closing is None and not self._receiver.unfinished():
                self._close.ask(EXIT_OWNER_LOST, None, "owner lost")
            # One close path: the owner's CLOSE, a signal, the owner lost and the receiver's
            # death each ask (close_request.py); the first asked is the close.
            if self._closing is None and (asked := self._close.first()) is not None:
                budget = self._close_timeout if asked.budget is None else asked.budget
                self._begin_close(asked.exit_code, budget, asked.why, asked.at)
            if self._closing is not None:
                _, straggler_deadline, _ = self._closing
                if (not self._active and caught_up) or now >= straggler_deadline:
                    break
        return self._finish()

    def _sink_lost(self) -> bool:
        """wandb-core died under us: the owner starts a new logger, which opens the run
        again (a new wandb-core) and takes the ranks' resent records. Saved as it stands."""
        lost = [w for w in self._writers.values() if w.sink_lost]
        if not lost or self._per_rank is not None:
            return False
        log_to_stderr(
            "wandb-core is gone; this logger exits and the owner starts a new one that "
            "continues the run (the ranks resend what was not saved)"
        )
        return True

    def _take_events(self, wait: float, limit: int) -> bool:
        """Handle up to ``limit`` events (waiting ``wait`` for the first); True when none
        are left queued."""
        events = self._receiver.events
        try:
            event = events.get(timeout=wait) if wait > 0 else events.get_nowait()
        except queue.Empty:
            return True
        for _ in range(limit):
            self._handle(event)
            try:
                event = events.get_nowait()
            except queue.Empty:
                return True
        self._handle(event)
        return events.empty()

    def _handle(self, event: Event) -> None:
        if isinstance(event, Records):
            now = time.monotonic()
            writer = self._writer_for(event.rank)
            records = event.records
            if event.replayed and self._before.steps_after_saved and records:
                # Resent after a restart: what the dead logger had taken in and wrote in rows
                # past its last saved point is in the run already (the rows' steps were read
                # from its segment); what it never took in is in none of its rows.
                in_run = self._before.in_dead_rows(event.rank, event.end_seq, records)
                if any(in_run):
                    unstated = self._before.steps_after_state
                    pairs = list(zip(records, in_run, strict=True))
                    for r, dup in pairs:
                        if dup and r[0] in unstated:  # written after the dead one's state:
                            self._duplicates += 1  # counted here, with its media
                            writer.media.logged += count_media(r[2])
                    records = [r for r, dup in pairs if not dup]
            top: int | None = None
            if not records:
                pass
            elif self._write_deadline is not None and now >= self._write_deadline:
                # Out of time to write rows: count the backlog instead of ordering it. Ordering
                # 500k queued records takes seconds, which the summary and finish need.
                writer.dropped += len(records)
            else:
                top = writer.order.add_batch(event.rank, records, now)
            writer.saves.batch(event.rank, event.end_seq, top, writer.rows)
            self._taken[event.rank] = event.end_seq
            if records:
                self._health.batch(event.rank, top, len(records), now)
            self._receiver.taken(len(event.records))
        elif isinstance(event, Attached):
            self._health.attached(event.rank, time.monotonic())
            self._active.add(event.rank)
            self._pids[event.rank] = event.pid
            writer = self._writer_for(event.rank)
            writer.order.rank_attached(event.rank, time.monotonic())
            writer.rank_attached(event.rank, event.pid)
        elif isinstance(event, Ended):
            self._ended(event)
        elif isinstance(event, Update):
            late = self._write_deadline is not None and time.monotonic() >= self._write_deadline
            if self._per_rank is None:
                self._keep_run_data(event.kind, event.data)
            self._writer_for(event.rank).update(event.kind, event.data, event.rank, late)
            if event.kind is UpdateKind.RUN and self._per_rank is None:
                # ranks that ask later (a Welcome, the run-info file) get the new name
                info = self._receiver.run_info = self.run_info()
                continuity.write_json(self._ipc_dir, RUN_INFO_FILE, info)

    def _ended(self, event: Ended) -> None:
        self._active.discard(event.rank)
        self._ended_ranks.add(event.rank)
        writer = self._writer_for(event.rank)
        writer.order.rank_done(event.rank)
        if event.exit_code:
            self._failed[event.rank] = event.exit_code
        if self._per_rank is not None:
            # A rank's own run ends with the rank: its exit code, or 1 when it died.
            code = EXIT_RANK_DIED if event.gone else event.exit_code
            stats = {"_funnel/ranks": 1, "_funnel/dead_ranks": int(event.gone)}
            # The write deadline applies here too: a rank that ends while the run closes must
            # not spend on its backlog the time the other runs' summaries need.
            writer.finish(code, stats, 0, self._write_deadline, self._closing_step)

    # -- rank health (issue 27) ---------------------------------------------------------------
    def _say(self, text: str) -> None:
        """A health report: on the terminal (stderr) and in the run's console."""
        log_to_stderr(text)
        writer = self._writers.get(None)
        if writer is None or writer.sink is None or writer.sink_lost:
            return
        try:
            writer.sink.output("stderr", f"wandb-funnel: {text}\n", time.time())
        except Exception:
            pass  # the terminal has it; a console record must never cost a row

    def _look_at_values(self, rows: list[Any]) -> None:
        health = self._health
        for row in rows:
            for rank, part in row.parts.items():
                for line in health.values(rank, row.step, part):
                    self._say(line)

    def _on_spread(self, key: str, ranks: list[int], values: list[Any], step: int) -> None:
        line = self._health.spread(key, ranks, values, step)
        if line is not None:
            self._say(line)

    def _look_for_stalls(self, now: float) -> None:
        found = self._health.check(now, self._active)  # a dead rank has left _active
        if found is None:
            return
        kind, text = found
        if kind == "resumed":
            self._say(text)
            return
        self._say(text)
        behind = [(r, self._pids.get(r)) for r in self._health.behind]
        threading.Thread(
            target=self._say_stacks, args=(behind,), name="wandb-funnel-stacks", daemon=True
        ).start()

    def _say_stacks(self, behind: list[tuple[int, int | None]]) -> None:
        """The lagging ranks' Python stacks, by py-spy when it is installed (bounded), on a
        thread of its own: the writer never waits for it."""
        import shutil
        import subprocess

        beside = os.path.join(os.path.dirname(sys.executable), "py-spy")  # the venv's bin
        spy = shutil.which("py-spy") or (beside if os.access(beside, os.X_OK) else None)
        for rank, pid in behind:
            if not pid or not self._local_ranks:
                continue
            if spy is None:
                self._say(
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
            self._say(f"rank {rank} (pid {pid}), py-spy dump:\n{stack[:8000]}")

    def status(self, now: float) -> dict[str, Any]:
        """What ``wandb-funnel status`` shows (``_status.py``), from counters at hand."""
        info = self._receiver.run_info or {}
        stats = self.stats()
        ranks = []
        for peer in sorted(self._receiver.peers(), key=lambda p: p["rank"]):
            progress = self._health.ranks.get(peer["rank"])
            last = progress.last_record if progress is not None else None
            since = None if last is None else round(now - last, 1)
            if peer["gone"]:
                state = "dead"
            elif peer["ended"]:
                state = "finished"
            elif peer["rank"] in self._health.behind or since is None or since >= _SILENT_AFTER:
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
        pending = sum(w.order.pending_rows for w in self._writers.values())
        return {
            "run_id": self._run_id,
            "name": info.get("name"),
            "project": info.get("project"),
            "owner_pid": self._owner_pid,
            "logger_pid": os.getpid(),
            "started": self._started,
            "state": "closing" if self._closing is not None else "running",
            "rows": stats["_funnel/rows"],
            "pending_rows": pending,
            "dropped": stats["_funnel/dropped_records"],
            "close": self._close_progress,
            "updated": time.time(),
            "ranks": ranks,
        }

    def _write_status(self, now: float) -> None:
        try:
            status = self.status(now)
        except Exception as exc:  # a status must never cost the run anything
            log_to_stderr(f"could not write status.json: {exc!r}")
            return
        continuity.write_json(self._ipc_dir, STATUS_FILE, status)

    def _finish_progress(self, rows_left: int) -> None:
        """While a close writes rows: past ``_CLOSE_QUIET`` seconds, once a second, how many
        rows are left and how much of the budget (on the terminal, as wandb's finish says
        its upload's progress), and the same in status.json."""
        if self._close_clock is None:
            return
        now = time.monotonic()
        start, budget = self._close_clock
        left = max(0.0, start + budget - now)
        self._close_progress = {"rows_left": rows_left, "seconds_left": round(left, 1)}
        if now < self._next_progress:
            return
        self._next_progress = now + 1.0
        self._write_status(now)
        if now - start >= _CLOSE_QUIET:
            log_to_stderr(f"closing: {rows_left} rows left to write, {left:.1f}s left")

    def _keep_run_data(self, kind: UpdateKind, data: dict[str, Any]) -> None:
        if kind is UpdateKind.CONFIG:
            self._run_data.config_update(data)
        elif kind is UpdateKind.SUMMARY:
            self._run_data.summary_update(data)
        elif kind is UpdateKind.METRIC:
            self._run_data.metric(data)
        elif kind is UpdateKind.RUN:
            self._run_data.run_update(data)

    # -- what is saved, and what a successor needs ---------------------------------------------
    def _note_saved(self, now: float) -> None:
        """Every ``_SAVE_PERIOD``: what the transaction log holds now. Ranks whose records
        reached it are told (after the state a successor reads is written: a rank never
        forgets a record that a restarted logger would not know is in the run)."""
        if now < self._next_save:
            return
        self._next_save = now + _SAVE_PERIOD
        moved: dict[int, int] = {}
        for writer in self._writers.values():
            if writer.sink_lost:
                continue  # rows not on disk yet are lost with wandb-core: never told saved
            try:
                rows = writer.sink.saved_rows() if writer.sink is not None else writer.rows
            except Exception as exc:
                log_to_stderr(f"{writer.name}: could not read what the run has saved: {exc!r}")
                continue
            moved.update(writer.saves.durable(rows))
            writer.forget_rows_before(writer.saves.unsaved_from())
            writer.media.release(writer.saves.saved_rows)
        if moved:
            self._write_state()
            self._receiver.post_saved(moved)
        if self._run_data.changed:
            self._run_data.changed = False
            continuity.write_json(self._ipc_dir, continuity.RUN_DATA_FILE, self._run_data.to_json())

    def _note_taken(self) -> None:
        """Before rows are handed to wandb: which records of each rank they may hold, for a
        successor (``continuity.TAKEN_FILE``). Written only when a rank's point moved."""
        if self._taken == self._taken_on_disk:
            return
        self._taken_on_disk = dict(self._taken)
        self._taken_note.write(self._taken_on_disk)

    def _write_state(self) -> None:
        """What a successor needs (``_logger/continuity.py``), written before any rank is
        told its records are saved. In run_mode="new" (a run per rank) only the saved points
        and ranks: those runs are resumed, not de-duplicated by step."""
        saved: dict[int, int] = {}
        for each in self._writers.values():
            saved.update(each.saves.saved)
        stats = self.stats()
        state: dict[str, Any] = {
            "generation": self._before.generation,
            "saved": {str(k): v for k, v in {**self._before.saved, **saved}.items()},
            "ranks": sorted(self._receiver.used_ranks()),
            # ranks still logging (those the dead logger knew, until they end here too)
            "active": sorted((self._active | self._before.active) - self._ended_ranks),
            "base": {k: stats[k] for k in continuity.ADDITIVE if k in stats},
        }
        writer = self._writers.get(None)
        if writer is not None:
            segment: dict[str, Any] | None = None
            if writer.sink is not None:
                try:
                    segment = writer.sink.segment()
                except Exception:
                    segment = None
            state.update(
                segments=self._before.segments,
                segment=segment,
                segment_unsaved_from=writer.recent_from,
                # the dead logger's records: these, plus those in the rows its file holds
                records=self._before.records + self._duplicates + writer.records_before_recent,
                recent_rows=list(writer.recent_rows),
                # media per recent row: those of rows that never reached the file are in
                # "base" but not in the run (a successor takes them off)
                recent_media=list(writer.recent_media),
            )
        continuity.write_json(self._ipc_dir, continuity.STATE_FILE, state)

    def _on_signal(self, signum: int, frame: Any) -> None:
        code = EXIT_SIGINT if signum == signal.SIGINT else EXIT_SIGTERM
        self._close.ask(code, _SIGNAL_BUDGET, "signalled")

    def _watch_owner(self) -> None:
        """On its own thread: the main thread may be stuck inside wandb when the owner dies,
        and then nobody else would ever end this process."""
        while os.getppid() == self._owner_pid:
            time.sleep(LOGGER_TICK)
        self._supervised = False
        if self._close.first() is not None:
            return  # closing already: the close has its watchdog
        # The ranks may live on (spawned workers run after their parent's SIGKILL; torchrun
        # stops the others on its own): their records are still written, until every rank
        # has finished or is gone. Then the run ends, with the owner's failure as its code.
        log_to_stderr(
            f"the owner (pid {self._owner_pid}) is gone without closing; the run goes on until "
            f"every rank has finished or died, then ends as failed (exit code {EXIT_OWNER_LOST})"
        )
        self._orphaned = True

    def _begin_close(
        self, exit_code: int, budget: float, why: str, since: float | None = None
    ) -> None:
        # Half the budget for stragglers, the rest to write rows and finish wandb.
        budget = max(0.0, budget)
        now = time.monotonic() if since is None else since
        self._closing = (exit_code, now + budget / 2, why)
        self._close_clock = (now, budget)
        self._write_deadline = now + max(budget / 2, budget - _FINISH_RESERVE)
        self._arm_watchdog(max(0.0, budget - (time.monotonic() - now)))

    def _arm_watchdog(self, budget: float) -> None:
        with self._watchdog_lock:
            if self._watchdog_armed:
                return
            self._watchdog_armed = True
        watchdog = threading.Timer(budget + _WATCHDOG_GRACE, self._give_up, args=(budget,))
        watchdog.daemon = True
        watchdog.start()

    def _give_up(self, budget: float) -> None:
        """The close ran out of time inside wandb (a server that does not answer holds its
        finish: plain wandb's would wait for ever). Say truthfully what is safe on disk and
        what is not, leave the accounting for the owner (it gets no DONE), and exit."""
        stats = self._final_stats_now()
        for writer in list(self._writers.values()):
            log_to_stderr(self._what_is_safe(writer, budget, stats))
        try:
            continuity.write_json(self._ipc_dir, FINAL_STATS, stats)
        finally:
            # The owner reads the accounting from the directory and removes it; with the owner
            # gone, nobody else will.
            if os.getppid() != self._owner_pid:
                remove_ipc_dir(self._ipc_dir)
            os._exit(3)

    def _final_stats_now(self) -> dict[str, Any]:
        """The accounting as it stands, from the watchdog's thread (counters only): records
        taken in but not yet handed to wandb are lost, and counted as dropped."""
        stats = self.stats()
        writers = list(self._writers.values())
        handled = sum(w.records + w.dropped for w in writers)
        queued_or_pending = max(0, self._receiver.received() - handled)
        stats["_funnel/dropped_records"] += queued_or_pending
        stats["_funnel/exit_reason"] = (self._closing[2] if self._closing else "closed") + (
            "; out of time inside wandb"
        )
        return stats

    def _what_is_safe(self, writer: RunWriter, budget: float, stats: dict[str, Any]) -> str:
        info = self._receiver.run_info or {}
        run_dir = os.path.dirname(str(info.get("dir") or "")) or "the run's directory"
        log = f"{run_dir}/run-{writer.name}.wandb"
        offline = bool(info.get("offline", True))
        head = f"could not finish the run within its {budget:.1f}s close budget"
        dropped = stats["_funnel/dropped_records"]
        lost = f"{dropped} records, counted" if dropped else "nothing"
        if writer.finish_called:
            where = "" if offline else ", and the upload to W&B did not finish in time"
            sync = f"wandb sync {run_dir}" if offline else f"wandb sync --include-online {run_dir}"
            return (
                f"{head} (wandb's finish did not return{where}). Safe on this disk, in the "
                f"run's transaction log {log}: its {writer.rows} rows ({writer.records} records), "
                f"its accounting and its exit record; lost: {lost}. Upload what W&B is "
                f"missing with:\n    {sync}"
            )
        return (
            f"{head} (wandb stalled before the run's exit record). Safe on this disk, in "
            f"{log}: {writer.rows} rows ({writer.records} records)"
            f"{' and the accounting' if writer.summary_sent else ''}; lost: the exit record "
            f"and {dropped} records not yet written (counted)."
        )

    # -- the end -------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The whole funnel's accounting (all writers)."""
        rx = self._receiver
        writers = list(self._writers.values())
        out = {
            "_funnel/records": sum(c.records for c in writers),
            "_funnel/rows": sum(c.rows for c in writers),
            "_funnel/late_records": sum(c.late_records for c in writers),
            "_funnel/dropped_records": sum(c.dropped for c in writers) + rx.dropped,
            # after a restart, the ranks the dead loggers had too (ended ones do not come back)
            "_funnel/ranks": max(rx.ranks, len(self._before.ranks)),
            "_funnel/dead_ranks": len(rx.dead_ranks),
            "_funnel/failed_ranks": len(self._failed),
            "_funnel/junk_frames": rx.junk_frames,
            "_funnel/rejected_peers": rx.rejected_peers + rx.auth_failures,
            "_funnel/media": sum(c.media.logged for c in writers),
            "_funnel/dropped_media": sum(c.media.dropped for c in writers),
            "_funnel/files": sum(c.media.files for c in writers),
            "_funnel/dropped_files": sum(c.media.dropped_files for c in writers),
            "_funnel/console_lines": sum(c.console.lines for c in writers),
            "_funnel/dropped_console_lines": sum(c.console.dropped for c in writers),
            "_funnel/replayed_records": rx.replayed,
            "_funnel/logger_restarts": self._before.generation,
            **self._health.summary(),
        }
        return self._with_earlier_segments(out)

    def _with_earlier_segments(self, out: dict[str, Any]) -> dict[str, Any]:
        """The accounting of a run that a restart cut in segments: theirs plus this one's."""
        for key, value in self._earlier_segments().items():
            out[key] = out.get(key, 0) + value
        return out

    def _earlier_segments(self) -> dict[str, int]:
        before = self._before
        if not before.generation:
            return {}
        return {
            **before.base,
            "_funnel/records": before.records + self._duplicates,
            "_funnel/rows": before.rows,
        }

    def teardown_budget(self) -> float:
        """Seconds left for shutting wandb-core down once the run is finished: what is left
        of the close's budget (its watchdog ends the process 1 s after it anyway)."""
        if self._close_clock is None:
            return _SIGNAL_BUDGET
        start, budget = self._close_clock
        return max(0.5, start + budget - time.monotonic())

    def _closing_step(self, step: str) -> None:
        """Say how far a close has got once rows ran out of time: if the owner then has to
        kill the logger, its stderr shows where the time went."""
        if self._close_clock is None or self._write_deadline is None:
            return
        now = time.monotonic()
        if now >= self._write_deadline:
            start, budget = self._close_clock
            log_to_stderr(f"closing: {step} at {now - start:.2f}s of a {budget:.1f}s budget")

    def _finish(self) -> int:
        assert self._closing is not None
        owner_code, _, why = self._closing
        self._closing_step("stopped waiting for ranks")
        self._receiver.stop(timeout=5.0)  # it takes in what is already queued, then stops
        self._closing_step("receiver stopped")
        while not self._take_events(0.0, 1_000_000):
            pass
        self._closing_step("queue emptied")
        for rank, pid in self._receiver.unfinished():
            log_to_stderr(
                f"rank {rank} (pid {pid}) had not finished when the run closed ({why}); "
                f"records it sends from now on are lost"
            )
        exit_code = run_exit_code(owner_code, list(self._failed.values()))
        extra = {k: v for k, v in self.stats().items() if k not in _PER_WRITER}
        extra["_funnel/exit_reason"] = why
        # Records the receiver dropped belong to the one run, unless there is a run per rank.
        elsewhere = self._receiver.dropped if self._per_rank is None else 0
        if None in self._writers:
            self._writers[None].earlier = self._earlier_segments()
        for key, writer in self._writers.items():
            if not self._receiver.footer and writer.sink is not None:
                writer.sink.without_footer()  # the program never called finish(): none
            # run_mode="new": a rank still unfinished at close did not finish in time.
            unfinished = key is not None and key in self._active
            code = owner_code or EXIT_RANK_DIED if unfinished else exit_code
            writer.finish(
                code,
                extra,
                elsewhere,
                self._write_deadline,
                self._closing_step,
                self._finish_progress,
            )
        stats = self.stats()
        stats["_funnel/exit_reason"] = why
        # wandb's footer leaves _funnel/* out (sinks/wandb/run.py): what went wrong is said
        # here, in one line, and stays in the run's summary under its _funnel/* keys.
        losses = [f"{stats[key]} {key[len('_funnel/') :]}" for key in _REPORTED if stats.get(key)]
        if losses:
            log_to_stderr(
                f"what did not go as logged (the run's summary has it under "
                f"_funnel/*): {', '.join(losses)}"
            )
        self.final_stats = stats
        self._say_how_to_sync()
        return exit_code

    def _say_how_to_sync(self) -> None:
        """A run continued by restarted loggers is in several segments: ``wandb sync`` uploads
        each with a command of its own, in order (one command for all skips the later ones
        after a segment cut mid-record: a killed logger's)."""
        writer = self._writers.get(None)
        if not self._before.generation or writer is None or writer.sink is None:
            return
        try:
            segments = [s.get("segment") or {} for s in self._before.segments]
            segments.append(writer.sink.segment())
        except Exception:
            return
        dirs = [os.path.dirname(str(s["path"])) for s in segments if s.get("kind") == "wandb"]
        online = not bool((self._receiver.run_info or {}).get("offline", True))
        if online:
            # This segment uploaded itself; a dead logger's may not have uploaded its last
            # rows (its wandb-core died with it). Its file has them: the command uploads the
            # whole segment again (rows the server already has may then appear twice).
            dirs = dirs[:-1]
        if not dirs:
            return
        flag = "--no-skip-online " if online else ""
        commands = "\n".join(f"    wandb sync {flag}{d}" for d in dirs)
        head = (
            f"the run is in {len(segments)} segments (the logger was restarted "
            f"{self._before.generation} times); "
        )
        if online:
            log_to_stderr(
                head + "the dead loggers' segments may not have uploaded their last rows; "
                f"their files have them (the server may then hold those it had twice):\n"
                f"{commands}"
            )
        else:
            log_to_stderr(
                head + f"to upload it, sync each in this order, one command each:\n{commands}"
            )


def _warn_once(name: str) -> Callable[[str], None]:
    """A writer's warnings, each said once (a reducer that cannot apply says so every row)."""
    said: set[str] = set()

    def warn(message: str) -> None:
        if message not in said and len(said) < 100:
            said.add(message)
            log_to_stderr(f"{name}: {message}")

    return warn


# The accounting that says something went missing or wrong: said on the terminal when not 0.
_REPORTED = (
    "_funnel/dropped_records",
    "_funnel/late_records",
    "_funnel/dropped_media",
    "_funnel/dropped_files",
    "_funnel/dropped_console_lines",
    "_funnel/dead_ranks",
    "_funnel/failed_ranks",
    "_funnel/junk_frames",
    "_funnel/rejected_peers",
    "_funnel/stalls",
    "_funnel/nonfinite",
)
# Counted per run by each writer itself; everything else is the funnel's.
_PER_WRITER = ("_funnel/records", "_funnel/rows", "_funnel/late_records", "_funnel/dropped_records")


def _write_ready(fd: int, payload: dict[str, Any]) -> None:
    try:
        os.write(fd, (json.dumps(payload) + "\n").encode())
    finally:
        os.close(fd)


def main() -> int:
    """Entry point of the logger process (``wandb_funnel._logger.__main__``): the start
    message arrives on stdin. Returns the exit code the run was finished with (1 when it
    could not be opened)."""
    if os.environ.pop(ENV_WARM, None):
        warm_up()  # started ahead of time: the slow imports, before the wait
    line = sys.stdin.buffer.readline()
    if not line.strip():
        return 0  # started ahead of time and never used: the owner is gone or done
    start = LoggerStart.from_json(line)
    if start.env is not None:  # the owner's, now (this process started with an older copy)
        os.environ.clear()
        os.environ.update(start.env)
    if start.cwd is not None:
        try:
            os.chdir(start.cwd)
        except OSError as exc:  # gone meanwhile: the directory it started in will do
            log_to_stderr(f"could not change to the owner's directory {start.cwd!r}: {exc}")
    ready_fd = start.ready_fd
    # A restart: what the dead logger left (its segment's tail read once it is final).
    before = continuity.resume(start.ipc_dir, start.generation)
    # wandb-core of its own (not the owner's): the run outlives the owner's death, and a
    # core that dies with this logger is replaced with it.
    os.environ.pop("WANDB_SERVICE", None)
    if before.generation and os.environ.get("WANDB_FUNNEL_DEBUG_RESTART"):
        steps = sorted(before.steps_after_saved)
        log_to_stderr(
            f"DEBUG continuation saved={before.saved} rows={before.rows} records={before.records} "
            f"steps_after={steps[:3]}..{steps[-3:]} ({len(steps)})"
        )
    # Until serve() installs its handlers, a stray Ctrl-C must not kill a half-made run.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    max_frame = start.options.max_record_bytes + BATCH_BYTES + 4096
    sock: LoggerSocket | None = None
    try:

        def open_run(
            overrides: dict[str, Any], stats_pid: int | None = None, opening: Opening | None = None
        ) -> Sink:
            # wandb-core samples the process that called wandb.init (the owner), not us.
            # A restarted logger resumes the run: wandb writes a new segment of it.
            resume = {"resume": "allow"} if start.generation else {}
            return open_sink(
                {**start.init_kwargs, **resume, **overrides},
                start.options.step_key,
                start.program,
                stats_pid or start.owner_pid,
                log_to_stderr,
                opening,
                start.generation,
            )

        sock = LoggerSocket(
            start.address,
            _PEER_RCV_HWM,
            max_frame,
            start.topology.tcp_host,
            start.curve,
            start.tcp_endpoint,
        )
        receiver = Receiver(
            sock,
            start.token,
            max_frame,
            _MAX_QUEUED_RECORDS,
            start.topology.first_auto_rank,
            os.path.join(start.ipc_dir, MEDIA_DIR) if start.ipc_dir else None,
            generation=start.generation,
            saved=before.saved,
            used_ranks=before.ranks,
        )
        logger = Logger(start, receiver, open_run, before)
        # An online run opens in the background: the owner's start (and with it every rank's
        # first log) does not wait for the network; records wait in the receiver's queue.
        # Offline, or where a server that does not answer must raise (as plain wandb.init
        # does), the run is open before the owner's start returns.
        background = start.options.on_network_error == "offline" and opens_online(start.init_kwargs)
        opening = Opening(
            time.monotonic() + start.options.start_timeout,
            start.options.on_network_error,
            logger.open_by,
        )
        if not background:
            logger.open_run(opening)
    except BaseException as exc:
        if sock is not None:
            sock.close()
        remove_ipc_dir(start.ipc_dir)
        _write_ready(ready_fd, {"error": f"{type(exc).__name__}: {exc}"})
        return 1
    receiver.start()
    ready = {
        "run_id": start.run_id,
        "pid": os.getpid(),
        "tcp": sock.tcp_endpoint,
        "run": logger.run_info(),
    }
    _write_ready(ready_fd, ready)
    try:
        if background:
            logger.watch()
            try:
                logger.open_run(opening)
            except SinkLostError:
                os._exit(EXIT_LOGGER_RESTART)  # as below: the owner starts the next logger
        code = logger.serve()
        if code != EXIT_LOGGER_RESTART:
            # wandb-core is this process's own: it writes the end of the run's transaction
            # log when shut down, not when it finds its parent gone (a forced shutdown).
            shut_down_own_service(logger.teardown_budget(), code)
        if code == EXIT_LOGGER_RESTART:
            # wandb-core is gone: nothing more to finish here. Out at once (wandb's exit
            # hook would wait on the dead core; the receiver thread still owns the socket);
            # the owner starts the next logger.
            os._exit(code)
        return code
    finally:
        # The receiver has stopped: the socket is ours now, for the owner's DONE.
        if receiver.closer is not None and not receiver.is_alive():
            stats = logger.final_stats or logger.stats()
            sock.reply(receiver.closer, codec.encode_done(Done(stats)))
        if not receiver.is_alive():
            if logger.final_stats is not None:
                # The run is finished and its wandb-core shut down: everything taken in is
                # in the file or counted. Every rank still listening may forget its records
                # (a closing one would otherwise wait for a successor that never comes).
                for identity, frame in receiver.everything_saved():
                    sock.reply(identity, frame)
            sock.close()
        # The owner removes the directory once it has read what is left there for it (the
        # run's info: it opened in the background); with the owner gone, nobody else will.
        if os.getppid() != start.owner_pid:
            remove_ipc_dir(start.ipc_dir)
