"""The logger's loop: take the receiver's events, dispatch them by type, write the rows the
order releases, and end with one close.

The loop owns no state of its own beyond which ranks are active; each part it drives owns
its state: ``Runs`` (the writers), ``Journal`` (exactly once across a logger's death),
``Ledger`` (the accounting), ``Monitor`` (health and status) and ``Close`` (the budget).
It ends when the owner sends CLOSE, when it is signalled directly, or when the owner
vanishes (a thread polls its parent pid): in each case it waits, bounded, for ranks still
sending, writes every buffered row, records the accounting and finishes the run.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any

from wandb_funnel import _private_dir
from wandb_funnel._constants import (
    EXIT_OWNER_LOST,
    EXIT_RANK_DIED,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    LOGGER_TICK,
)
from wandb_funnel._logger import closing, ledger
from wandb_funnel._logger.attempt import job_attempt, status_of
from wandb_funnel._logger.closing import Close
from wandb_funnel._logger.continuity import Continuation
from wandb_funnel._logger.events import Attached, Ended, Event, FoldedRecords, Records, Update
from wandb_funnel._logger.intake import Intake
from wandb_funnel._logger.journal import Journal
from wandb_funnel._logger.ledger import Ledger
from wandb_funnel._logger.monitor import Monitor
from wandb_funnel._logger.pacing import Pacer
from wandb_funnel._logger.receiver import Receiver
from wandb_funnel._logger.runs import Runs, SinkLostError
from wandb_funnel._logger.say import log_to_stderr
from wandb_funnel._outcomes import LoggerResult, Outcome
from wandb_funnel._protocol.messages import LoggerStart, UpdateKind
from wandb_funnel.sinks import Opening, Sink

_EVENTS_PER_WAKE = 125  # events (batches of <= 256 records) taken before rows are written
# Rows written per wake-up (about 0.2 s of wandb.log): the loop comes back often enough to
# see a CLOSE, a signal or a dead owner even with a long backlog of rows.
_ROWS_PER_WAKE = 1_000
_STATE_SHARE = 0.03  # of the logger's time, at most, for the successor's state (and Saved)


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
    """One funnel's writer: routes the receiver's events to its runs, and closes them."""

    def __init__(
        self,
        start: LoggerStart,
        receiver: Receiver,
        open_sink: Callable[..., Sink],
        before: Continuation | None = None,
    ) -> None:
        self._dir = start.ipc_dir
        self._owner_pid = start.owner_pid
        self._receiver = receiver
        self.journal = Journal(start.ipc_dir, before, attempt=job_attempt(start))
        started = float((start.program or {}).get("start_time") or time.time())
        self.monitor = Monitor(
            start.options.stall_timeout,
            receiver,
            start.ipc_dir,
            start.topology.tcp_host is None,
            {"run_id": start.run_id, "owner_pid": start.owner_pid, "started": started}
            | status_of(self.journal.attempt),
        )
        self.ledger = Ledger(receiver, self.monitor.health, self.journal)
        self.runs = Runs(start, open_sink, self.journal, self.monitor.spread)
        self.close = Close(receiver.close_requests, start.options.close_timeout)
        self._intake = Intake(self.runs, self.journal, self.monitor, self.close, receiver.events)
        self.monitor.console = self._console
        self._expected_ranks = start.topology.expected_ranks
        if self.runs.per_rank is not None:
            receiver.run_info = {}  # no one run to tell the ranks about
        self._active: set[int] = set()  # ranks attached and not yet finished or gone
        self._ended_ranks: set[int] = set()  # ranks that finished or are gone
        self._unsaid: dict[int, int] = {}  # saved points not yet told (``_note_saved``)
        self._unsaid_ending = False
        self._state_pacer = Pacer(_STATE_SHARE)
        self.final_stats: dict[str, Any] | None = None

    # -- opening -------------------------------------------------------------------------------
    def open_run(self, opening: Opening) -> None:
        """Open the one run (not in run_mode="new": those open as their ranks attach), then
        tell the ranks its name and directory. Until it is open, the ranks' records wait in
        the receiver's queue (bounded: past it they are counted as dropped).

        Raises:
            Exception: the run could not be opened at start (``opening`` says whether a
                server that does not answer raises, or means an offline run).
            SinkLostError: it could not be opened in the background: a successor tries.
        """
        if self.runs.per_rank is not None:
            return
        writer = self.runs.open_main(opening, self._open_failed)
        self.journal.continue_run(writer, log_to_stderr)
        # A launched job's ranks are known before they attach: rows wait for them from
        # the start (within the first window), so ranks that start a little later still
        # merge, and ranks that never call wandb cost that one window, not one a row.
        for rank in (*self._expected_ranks, *self.journal.before.active):
            writer.order.rank_expected(rank)
        self._publish_run_info()
        # A successor must know this segment even if this logger dies before its first row
        # is saved (it then reads the segment from its start).
        self._write_state()

    def _open_failed(self, exc: Exception) -> None:
        if not self.close.watching:
            raise exc  # at start, in the foreground: the owner's start raises it
        if self.close.supervised and self.close.requests.first() is None:
            # In the background (online), wandb-core died or wandb failed under us: the
            # owner starts a new logger, which opens the run again (bounded restarts).
            log_to_stderr(f"could not open the run: {type(exc).__name__}: {exc}; exiting")
            raise SinkLostError from exc
        # In the background the owner has returned long ago: the ranks' records are
        # counted as dropped, and the run's absence is said once.
        log_to_stderr(f"could not open the run: {type(exc).__name__}: {exc}")
        log_to_stderr("every record the ranks send is counted as dropped")

    def _console(self) -> Sink | None:
        """The one run's sink while its wandb-core answers (health reports go there too)."""
        writer = self.runs.main
        return None if writer is None or writer.sink_lost else writer.sink

    def _publish_run_info(self) -> None:
        info = self._receiver.run_info = self.runs.info()
        _private_dir.write_json(self._dir, _private_dir.RUN_INFO, info)

    def run_info(self) -> dict[str, Any]:
        return self.runs.info()

    def open_by(self) -> float | None:
        return self.close.open_by()

    def watch(self) -> None:
        """Take signals and watch the owner from now on: a close may come while the run is
        still opening (``open_run`` stops waiting for the network then)."""
        self.close.watch(self._owner_pid)

    # -- the loop ------------------------------------------------------------------------------
    def serve(self) -> LoggerResult:
        """Run until closed: the run finished with its exit code, or a restart asked."""
        self.watch()
        more_rows = False
        window_applies = True
        while True:
            now = time.monotonic()
            # A row's deadline only matters while the window can apply: waiting 0 for one that
            # cannot fire spun this loop, holding the GIL from the receiver it waits for.
            deadlines = [d for w in self.runs if window_applies and (d := w.order.next_deadline())]
            wait = min([LOGGER_TICK, *(max(0.0, d - now) for d in deadlines)])
            caught_up = self._take_events(0.0 if more_rows else wait, _EVENTS_PER_WAKE)
            now = time.monotonic()
            # While events are still queued, or frames still wait unread in the socket, the
            # logger is behind: a row's window may have run out while the straggler's records
            # wait in a queue, so rows wait for floors (or the memory bound) until it has
            # caught up (docs/DESIGN.md, "Windows apply only when caught up").
            window_applies = caught_up and self._receiver.socket_drained(now)
            more_rows = self._write_released(now, window_applies)
            self._note_saved(now)
            self.monitor.tick(now, self._active, self._status)
            # A close already asked (a signal that reached wandb-core too, as scancel's does)
            # is not given up for a restart: the job is ending, and a new logger would not
            # start within a scheduler's grace.
            if (
                self.close.supervised
                and not self.close.begun
                and self.close.requests.first() is None
                and self.runs.sink_lost()
            ):
                log_to_stderr(
                    "wandb-core is gone; this logger exits and the owner starts a new one that "
                    "continues the run (the ranks resend what was not saved)"
                )
                return LoggerResult(Outcome.RESTART, 0)
            if (
                self.close.orphaned
                and not self.close.begun
                and not self._receiver.streams.unfinished()
            ):
                self.close.requests.ask(EXIT_OWNER_LOST, None, "owner lost")
            # One close path: the owner's CLOSE, a signal, the owner lost and the receiver's
            # death each ask (close_request.py); the first asked is the close.
            if self.close.begin_if_asked(self._give_up) and (
                (not self._active and caught_up) or now >= self.close.straggler_deadline
            ):
                self._note_saved(now, at_once=True)
                break
        return LoggerResult(Outcome.FINISHED, self._finish())

    def _write_released(self, now: float, window_applies: bool) -> bool:
        """Write the rows each run's order releases now; True when more are ready."""
        more = False
        for writer in self.runs:
            if writer.finished:
                continue
            rows = writer.order.pop_ready(now, window_applies, _ROWS_PER_WAKE)
            if rows:
                self.journal.before_rows_written()
            self.monitor.rows(rows)
            writer.write(rows, self.close.write_deadline)
            more |= len(rows) >= _ROWS_PER_WAKE
            writer.journal.saves.written(
                writer.order.last_released_step, writer.rows, writer.records
            )
        return more

    def _take_events(self, wait: float, limit: int) -> bool:
        """Handle about ``limit`` events (waiting ``wait`` for the first); True when none
        are left queued."""
        events = self._receiver.events
        taken = 0
        while taken < limit:  # (a drain's list is taken whole: past limit by at most one)
            try:
                batch = events.get(0.0 if taken else wait)
            except queue.Empty:
                return True
            for event in batch:
                self._handle(event)
            taken += len(batch)
        return events.empty()

    def _handle(self, event: Event) -> None:
        if isinstance(event, Records | FoldedRecords):
            self._intake.take(event)
        elif isinstance(event, Attached):
            now = time.monotonic()
            self.monitor.attached(event.rank, event.pid, now)
            self.runs.pids[event.rank] = event.pid
            self._active.add(event.rank)
            writer = self.runs.for_rank(event.rank)
            writer.order.rank_attached(event.rank, now)
            writer.rank_attached(event.rank, event.pid)
        elif isinstance(event, Ended):
            self._ended(event)
        elif isinstance(event, Update):
            late = self.close.past_write_deadline()
            if self.runs.per_rank is None:
                self.journal.keep(event.kind, event.data)
            self.runs.for_rank(event.rank).update(event.kind, event.data, event.rank, late)
            if event.kind is UpdateKind.RUN and self.runs.per_rank is None:
                self._publish_run_info()  # ranks that ask later get the new name

    def _ended(self, event: Ended) -> None:
        self._active.discard(event.rank)
        self._ended_ranks.add(event.rank)
        self._unsaid_ending |= event.rank in self._unsaid  # (it waits for its point)
        writer = self.runs.for_rank(event.rank)
        writer.order.rank_done(event.rank)
        if event.exit_code:
            self.ledger.failed[event.rank] = event.exit_code
        if self.runs.per_rank is not None:
            # A rank's own run ends with the rank: its exit code, or 1 when it died.
            code = EXIT_RANK_DIED if event.gone else event.exit_code
            shared = {"_funnel/ranks": 1, "_funnel/dead_ranks": int(event.gone)}
            # The write deadline applies here too: a rank that ends while the run closes must
            # not spend on its backlog the time the other runs' summaries need.
            writer.finish(
                code,
                lambda w: self.ledger.for_run(w, shared, 0, main=False),
                self.close.write_deadline,
                self.close.step,
            )

    # -- saved, and what a successor needs -----------------------------------------------------
    def _note_saved(self, now: float, at_once: bool = False) -> None:
        """What the transaction logs hold now; ranks whose records reached them are told,
        after the state a successor reads is written: at most ``_STATE_SHARE`` of the time
        (the points wait meanwhile), but at once for a rank that has ended (it waits for
        its point at exit), and ``at_once`` as the loop ends."""
        moved = self.journal.durable(self.runs, log_to_stderr)
        if moved:
            self._unsaid.update(moved)
            self._unsaid_ending |= not self._ended_ranks.isdisjoint(moved)
        if self._unsaid and (at_once or self._unsaid_ending or self._state_pacer.due(now)):
            began = time.monotonic()
            self._write_state()
            self._state_pacer.ran(now, began)
            self._receiver.saved.post(self._unsaid)
            self._unsaid, self._unsaid_ending = {}, False

    def _write_state(self) -> None:
        active = (self._active | self.journal.before.active) - self._ended_ranks
        stats = self.ledger.funnel(self.runs)
        self.journal.state(self.runs.writers, set(self._receiver.streams.used_ranks), active, stats)

    def _status(self, now: float) -> dict[str, Any]:
        stats = self.ledger.funnel(self.runs)
        return self.monitor.status(now, stats, self.runs.pending_rows(), self.close.begun)

    def _progress(self, rows_left: int) -> None:
        if self.close.budget is not None:
            self.monitor.close_progress(rows_left, self.close.budget, self._status)

    # -- the end -------------------------------------------------------------------------------
    def _give_up(self, budget: float) -> None:
        """On the watchdog's thread: the close ran out of time inside wandb."""
        why = self.close.why or "closed"
        stats = self.ledger.cut_short(self.runs, why)
        info = self._receiver.run_info or {}
        said = [closing.what_is_safe(w, budget, stats, info) for w in self.runs]
        closing.give_up(self._dir, self._owner_pid, stats, said)

    def teardown_budget(self) -> float:
        return self.close.teardown_budget()

    def _finish(self) -> int:
        close = self.close
        close.step("stopped waiting for ranks")
        self._receiver.stop(timeout=5.0)  # it takes in what is already queued, then stops
        close.step("receiver stopped")
        while not self._take_events(0.0, 1_000_000):
            pass
        close.step("queue emptied")
        for rank, pid in self._receiver.streams.unfinished():
            log_to_stderr(
                f"rank {rank} (pid {pid}) had not finished when the run closed ({close.why}); "
                f"records it sends from now on are lost"
            )
        exit_code = run_exit_code(close.exit_code, list(self.ledger.failed.values()))
        closing.finish_runs(
            self.runs, self.ledger, close, exit_code, self._active, self._receiver, self._progress
        )
        self.journal.close()  # no rows after this
        self.final_stats = stats = self.ledger.funnel(self.runs)
        stats["_funnel/exit_reason"] = close.why
        # wandb's footer leaves _funnel/* out (sinks/wandb/run.py): what went wrong is said
        # here, in one line, and stays in the run's summary under its _funnel/* keys.
        line = ledger.losses(stats)
        if line is not None:
            log_to_stderr(line)
        main = self.runs.main
        online = not bool((self._receiver.run_info or {}).get("offline", True))
        advice = self.journal.sync_advice(main.sink if main else None, online)
        if advice is not None:
            log_to_stderr(advice)
        return exit_code
