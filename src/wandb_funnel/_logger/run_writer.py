"""One wandb run inside the logger: its reorder buffer, its row builder and its sink.

A logger owns one writer in ``auto`` and ``shared`` mode, and one per rank in ``new`` mode.
Write failures are counted and reported here, never raised into the logger's loop.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Any

from wandb_funnel._logger.console import ConsoleLines
from wandb_funnel._logger.journal import RunJournal, saved_rows
from wandb_funnel._logger.media import MediaFiles, has_media
from wandb_funnel._logger.ordering import Reorderer, Row
from wandb_funnel._logger.reduce import RowBuilder
from wandb_funnel._logger.say import log_to_stderr
from wandb_funnel._logger.steps import TRUE_STEP_KEY, StepPlacer
from wandb_funnel._protocol.messages import UpdateKind
from wandb_funnel.sinks import Sink

_FINISH_SLICE = 1_000  # rows released at a time while finishing
_LABEL = re.compile(r"[\w.@-]{1,128}")  # a rank's stats label: rank1-host


class RunWriter:
    """Rows for one run; called from the logger's main thread only."""

    def __init__(
        self,
        sink: Sink | None,
        order: Reorderer,
        builder: RowBuilder,
        name: str,
        media: MediaFiles | None = None,
        step_key: str = "global_step",
    ) -> None:
        self.sink = sink
        self.media = media or MediaFiles(None)
        self.console = ConsoleLines()
        self.order = order
        self._builder = builder
        self.name = name
        self.steps = StepPlacer()  # where each row goes on the run's _step axis
        self.step_key = step_key  # where a late row keeps its own step
        self.late_records = 0  # records not written at their own step (a late row)
        # A continued attempt's run: rows below this step are logged again after a restore
        # (_logger/attempt.py), written at the next free step and counted, not late.
        self.relog_below = 0
        self.relogged_steps = 0
        self._late_said = False
        self.records = 0  # records written into the run
        self.rows = 0  # history rows made: one per step, however many ranks logged it
        self.dropped = 0  # records that reached the logger but not the run
        # How far finish() got: what a close cut short by a stalled wandb can truthfully say.
        self.summary_sent = False  # the accounting reached wandb (its transaction log)
        self.finish_called = False  # the exit record went to wandb: finish waits on uploads
        self.finished = False
        self._ranks: set[int] = set()  # ranks attached to this run
        self._measured: set[int] = set()  # ranks whose process wandb-core samples itself
        # A writer whose run could not be opened is broken from the start.
        self._broken: str | None = None if sink is not None else "the run could not be opened"
        self.sink_lost = False  # wandb-core went away (an OSError from the sink)
        self._counted_the_dead = False  # its unwritten rows counted (a close's, once)
        # Which records are written and on disk, and what the recent rows hold: the
        # Journal's part of this run (what a restarted logger needs).
        self.journal = RunJournal()

    def write(self, rows: list[Row], deadline: float | None = None) -> None:
        """Write ``rows``; past ``deadline`` (monotonic) the rest are counted, not written."""
        for row in rows:
            if deadline is not None and self._broken is None and time.monotonic() >= deadline:
                self._out_of_time()
            if self._broken is not None or self.sink is None:
                self.dropped += row.records
                continue
            parts = row.parts.values()
            with_media = any(has_media(part) for part in parts)
            if with_media:
                self.media.keep(parts, self.rows)  # until the row is saved (a restart)
            media_before = self.media.logged
            try:
                # The sink makes the row's media refs into what it writes (sinks.refs).
                out = self._builder.build(row)
                before = self.steps.state()
                at = self.steps.place(row.step, row.committed)
                if at.late:  # not at its own step: it keeps it, for the user and a restart
                    self._late(row, at.step)
                    out.setdefault(self.step_key, row.step)
                    out[TRUE_STEP_KEY] = row.step
                try:
                    self.sink.log(out, self.media if with_media else None, at.step, at.commit)
                except Exception:
                    self.steps.restore(before)  # wandb took no row: the axis is as it was
                    raise
                self.records += row.records
                if at.new_row:
                    self.rows += 1
                self.journal.row_written(row.records, self.media.logged - media_before, at.new_row)
            except Exception as exc:  # wandb-core gone, or a value wandb refuses
                if isinstance(exc, OSError):  # ConnectionResetError, BrokenPipeError, ...
                    self._broken = repr(exc)
                    self.sink_lost = True
                    log_to_stderr(
                        f"{self.name}: wandb stopped taking rows ({exc!r}); counting the rest"
                    )
                else:
                    log_to_stderr(f"{self.name}: wandb refused the row at step {row.step}: {exc!r}")
                self.dropped += row.records
            finally:
                if with_media:
                    self.media.discard(parts)  # what wandb did not move into the run

    def _late(self, row: Row, at: int | None) -> None:
        """A row that cannot take its step: its records are counted when they came after
        their step was written (``row.late``; the rows after one, whose steps it took, are
        moved, not late), and it is said once, with its cause."""
        if row.late:
            self.late_records += row.records
        elif self.relog_below:  # a continued attempt's: logged again, or moved up by those
            if row.step >= self.relog_below:
                return
            self.relogged_steps += 1
            if self.relogged_steps == 1:
                log_to_stderr(
                    f"{self.name}: step {row.step} logged again after the job's restart (the "
                    f"run had reached _step {self.relog_below - 1}); kept, at _step {at} with "
                    f"its own step under {self.step_key!r}; counted as _funnel/relogged_steps"
                )
            return
        if self._late_said:
            return
        self._late_said = True
        log_to_stderr(
            f"{self.name}: records for step {row.step} (rank {min(row.parts, default=0)}) came "
            f"after a later step was written; wandb takes no step below its current one, so "
            f"they are written at _step {at} with their own step under {self.step_key!r}, and "
            f"counted as _funnel/late_records; rows after them whose _step is taken move up "
            f"one, keeping their step there too (said once). A rank that lags the others by "
            f"more than reorder_window seconds does this: raise reorder_window "
            f"(WANDB_FUNNEL_REORDER_WINDOW) to keep every row at its step"
        )

    def tensorboard_synced(self) -> None:
        """A rank syncs tensorboard into the run: wandb-core places rows from now on."""
        self.steps.tensorboard()

    def rank_attached(self, rank: int, pid: int) -> None:
        """``rank`` (process ``pid``) attached. Once a second rank has, console lines are
        labelled with their rank, and every rank's system metrics are written labelled."""
        self._ranks.add(rank)
        if pid and self.sink is not None and pid == self.sink.stats_pid:
            self._measured.add(rank)
        if len(self._ranks) > 1:
            self.console.label(self.sink if self._broken is None else None)

    def _stats(self, data: dict[str, Any], rank: int) -> None:
        """A rank's system metrics, each key labelled as wandb labels a writer's: the rank
        the logger knows the peer by, and the host it says. While that rank is the run's only
        one and wandb-core samples its process (``x_stats_pid``: the process that called
        ``wandb.init``), wandb-core's unlabelled series are its figures, as with plain
        wandb: a labelled copy would only repeat them."""
        if rank in self._measured and len(self._ranks) < 2:
            return
        host, values = data.get("host"), data.get("stats")
        if (
            self.sink is None
            or self._broken is not None
            or type(host) is not str
            or not _LABEL.fullmatch(host)
            or type(values) is not dict
        ):
            return
        label = f"rank{rank}-{host}"
        numbers = {
            f"{k}/l:{label}": v
            for k, v in values.items()
            if type(k) is str and type(v) in (int, float)
        }
        if numbers:
            self._call("stats", self.sink.stats, numbers)

    def _tensorboard(self, data: dict[str, Any]) -> None:
        """A rank's tensorboard log directory: wandb-core watches it and reads its tfevents
        files from disk into the run's history, as for plain wandb's ``sync_tensorboard``.
        wandb-core resolves a relative path against its own working directory (the owner's,
        where it was started, and the logger's); one relative to another directory is made
        absolute, and one that already means the same directory is passed as given, so the
        run's ``tbrecord`` is plain wandb's."""
        log_dir, save, root_dir, cwd = (data.get(k) for k in ("log_dir", "save", "root_dir", "cwd"))
        sink = self.sink
        if (
            sink is None
            or type(log_dir) is not str
            or not log_dir
            or type(save) is not bool
            or type(root_dir) is not str
            or type(cwd) is not str
        ):
            return
        if cwd != os.getcwd():
            log_dir = os.path.join(cwd, log_dir)
            root_dir = os.path.join(cwd, root_dir) if root_dir else ""
        self.tensorboard_synced()
        self._call(
            f"tensorboard log directory {log_dir!r}",
            lambda d: sink.tensorboard(d, save, root_dir),
            log_dir,
        )

    def _out_of_time(self) -> None:
        self._broken = "out of time"
        log_to_stderr(f"{self.name}: out of time to write rows; counting the rest as dropped")

    def update(
        self, kind: UpdateKind, data: dict[str, Any], rank: int = 0, late: bool = False
    ) -> None:
        """A rank's update. ``late``: past the close's write deadline, console text and
        system metrics are counted or skipped, never written (the exit keeps its budget)."""
        if kind is UpdateKind.FILES:  # staged files: the writer's media takes them, cleans up
            self.media.log_files(data, self.sink)
        elif kind is UpdateKind.CONSOLE:
            self.console.take(rank, data, self.sink if self._broken is None else None, late)
        elif kind is UpdateKind.STATS:
            if not late:
                self._stats(data, rank)
        elif kind is UpdateKind.TENSORBOARD:
            self._tensorboard(data)
        elif self.sink is not None:
            fn: Callable[[dict[str, Any]], None] = {
                UpdateKind.CONFIG: self.sink.update_config,
                UpdateKind.SUMMARY: self.sink.update_summary,
                UpdateKind.METRIC: self.sink.define_metric,
                UpdateKind.RUN: self.sink.update_run,
            }[kind]
            self._call(f"{kind.label} update {list(data)!r}", fn, data)

    def finish(
        self,
        exit_code: int,
        accounting: Callable[[RunWriter], dict[str, Any]],
        write_deadline: float | None = None,
        step_done: Callable[[str], None] = lambda step: None,
        progress: Callable[[int], None] = lambda rows_left: None,
    ) -> None:
        """Write every buffered row (until ``write_deadline``; the rest are counted), then the
        accounting (``accounting(self)``, once the rows are done: the ``Ledger``'s figures
        for this run), then the exit code; once.

        Rows are what may not fit in the time left: the summary and the exit record always
        get written (when wandb answers at all), so a run never ends without its accounting.
        """
        if self.finished:
            return
        self.finished = True
        # In slices, so that rows that will not fit before the deadline are counted in bulk,
        # never released one by one (a heap pop each): however long the backlog, the summary
        # and finish keep their reserve (docs/DESIGN.md, "Close is a budget").
        records, dropped = self.records, self.dropped
        while self._broken is None and self.sink is not None:
            if write_deadline is not None and time.monotonic() >= write_deadline:
                self._out_of_time()
                break
            progress(self.order.pending_rows)
            rows = self.order.pop_all(_FINISH_SLICE)
            if not rows:
                break
            self.write(rows, write_deadline)
        self.dropped += self.order.drop_all()
        written, counted = self.records - records, self.dropped - dropped
        if counted:
            log_to_stderr(
                f"{self.name}: {counted} buffered records counted as dropped ({self._broken})"
            )
        step_done(f"{self.name}: buffered rows done ({written} records written, {counted} counted)")
        if self._broken == "out of time":
            self._broken = None  # rows stopped; the summary and finish still go
        self.console.flush(self.sink if self._broken is None else None)
        if self.sink_lost:
            self._count_what_died_with_wandb()
        summary = accounting(self)
        if self.sink is None or self._broken is not None:
            return
        sent = self.summary_sent = self._call("summary", self.sink.update_summary, summary)
        step_done(f"{self.name}: accounting {'sent' if sent else 'refused'}")
        sink = self.sink
        if self._builder.user_step_key:  # the footer shows that key: it is the user's
            self._call("step key", lambda _: sink.users_step_key(), None)
        self.finish_called = True
        finished = self._call("finish", self.sink.finish, exit_code)
        if not finished and self.sink_lost:
            self._count_what_died_with_wandb()
        step_done(f"{self.name}: run {'finished' if finished else 'not finished'}")

    def _count_what_died_with_wandb(self) -> None:
        """wandb-core died during the close, when no successor is started: the rows it took
        but never wrote to its transaction log died with it. Their records are counted as
        dropped, not as the run's (the file says how many rows it holds); said once."""
        if self.sink is None or self._counted_the_dead:
            return
        self._counted_the_dead = True
        lost = self.journal.records_from_row(saved_rows(self.sink, self.rows))
        if lost:
            self.records -= lost
            self.dropped += lost
            log_to_stderr(
                f"{self.name}: wandb-core died during the close; {lost} records in rows it had "
                f"not written to its file are lost with it (counted as dropped)"
            )

    def _call(self, what: str, fn: Callable[[Any], None], arg: Any) -> bool:
        """``fn(arg)``, reporting a failure instead of raising; True when it went through."""
        if self._broken is not None:
            return False
        try:
            fn(arg)
        except Exception as exc:
            log_to_stderr(f"{self.name}: wandb refused a {what}: {exc!r}")
            if isinstance(exc, OSError) and self.finished:  # wandb-core gone in the close
                self.sink_lost = True
            return False
        return True
