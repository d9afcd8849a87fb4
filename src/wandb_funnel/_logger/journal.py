"""Journal: the one home of "every record exactly once across a logger's death".

A rank keeps each record it sent until the logger says it is saved (``_worker/replay.py``);
a logger that dies is replaced, the ranks resend what they were not told is saved, and the
new logger must write each resent record once: none twice, none lost. Its parts, all here:

- **admit**: a resent record that the dead logger's rows already hold is not written again
  (``Continuation.in_dead_rows``); it is counted as the run's (``duplicates``).
- **taken**: before rows are handed to wandb, which records of each rank they may hold
  (``continuity.TakenNote``): a successor tells "written" from "never taken in" by it.
- **written / durable**: per run, which records are in rows written, then in rows the
  transaction log holds (``saving.SaveTracker``), and what each recent row holds (a
  successor's count of the rows its predecessor's file really has: ``RunJournal``).
- **state**: what a successor needs, written before any rank is told its records are saved
  (``continuity.py``'s files in the private directory), and the run's config, summary,
  metrics and name for the new segment (``RunData``).
- **segments**: the run's earlier segments, and the ``wandb sync`` advice they need.

The journal reads and writes files and keeps counts; it never writes rows or talks to a
socket: the loop gives it what happened and does what it says (tested in process, with a
fake clock and a fake sink: ``tests/test_journal.py``).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from wandb_funnel import _private_dir
from wandb_funnel._logger.continuity import ADDITIVE, Continuation, RunData, TakenNote
from wandb_funnel._logger.saving import SaveTracker
from wandb_funnel._protocol.messages import UpdateKind
from wandb_funnel.sinks import Restartable, Sink

if TYPE_CHECKING:
    from wandb_funnel._logger.attempt import JobAttempt
    from wandb_funnel._logger.run_writer import RunWriter

_SAVE_PERIOD = 0.2  # seconds between looks at what the transaction log holds


class RunJournal:
    """One run's part: which records are written and on disk (``saves``), and what each row
    written since the first that may hold an unsaved record holds (records, media)."""

    def __init__(self, saved: dict[int, int] | None = None) -> None:
        self.saves = SaveTracker(saved)
        self.recent_rows: deque[int] = deque()  # records per row, from row recent_from
        self.recent_media: deque[int] = deque()  # media values per row, as recent_rows
        self.recent_from = 0
        self.records_before_recent = 0  # records in the rows before recent_from

    def row_written(self, records: int, media: int, new_row: bool) -> None:
        """A row went to wandb: a new history row, or merged into the open one."""
        if new_row:
            self.recent_rows.append(records)
            self.recent_media.append(0)
        elif self.recent_rows:  # merged into the open row: one history row still
            self.recent_rows[-1] += records
        if self.recent_media:  # (a row whose media wandb refused takes its keys off)
            self.recent_media[-1] += max(0, media)

    def records_from_row(self, row: int) -> int:
        """The records in the rows written from ``row`` on (rows before the first that may
        hold an unsaved record are not kept: none of them is past a saved point)."""
        return sum(list(self.recent_rows)[max(0, row - self.recent_from) :])

    def forget_rows_before(self, row: int) -> None:
        """Per-row counts before ``row`` are no longer needed (nothing unsaved is there)."""
        recent = self.recent_rows
        while self.recent_from < row and recent:
            self.records_before_recent += recent.popleft()
            self.recent_media.popleft()
            self.recent_from += 1


class Journal:
    """The logger's side of exactly-once (module docstring). Main thread only."""

    def __init__(
        self,
        directory: str | None,
        before: Continuation | None = None,
        clock: Callable[[], float] = time.monotonic,
        attempt: JobAttempt | None = None,
    ) -> None:
        self._dir = directory
        self.before = before or Continuation.empty()
        self.attempt = attempt  # the run as an attempt of a job that was restarted
        self.run_data = RunData(self.before.run_data)
        # Resent records whose rows the dead logger wrote after its last state: the run's,
        # and counted here (its state could not count them).
        self.duplicates = 0
        self._taken = TakenNote(directory, self.before.generation)  # rank -> end taken in
        self._clock = clock
        self._next_save = 0.0

    @property
    def generation(self) -> int:
        """Loggers before this one in the run (0: the first)."""
        return self.before.generation

    def for_run(self, main: bool) -> RunJournal:
        """A run's journal; ``main``: the funnel's one run, whose saved points a restart
        carries (a run per rank is resumed by its own saved points only)."""
        return RunJournal(self.before.saved if main else None)

    # -- records in ----------------------------------------------------------------------------
    def admit(
        self, rank: int, end_seq: int, records: list[Any], replayed: bool
    ) -> tuple[list[Any], list[Any]]:
        """Of a batch of ``rank``'s records (sequence numbers up to ``end_seq``): those to
        write, and the duplicates among those counted as the run's here (their media count
        as logged). A resent record that a dead logger's row past its last saved point
        holds is in the run already; what it never took in is in none of its rows."""
        before = self.before
        if not (replayed and records and any(steps for steps, _ in before.layers())):
            return records, []
        in_run = before.in_dead_rows(rank, end_seq, records)
        if not any(in_run):
            return records, []
        unstated = before.steps_after_state
        pairs = list(zip(records, in_run, strict=True))
        counted = [r for r, dup in pairs if dup and r[0] in unstated]
        self.duplicates += len(counted)  # written after the dead one's state: counted here
        return [r for r, dup in pairs if not dup], counted

    def took(self, rank: int, end_seq: int) -> None:
        self._taken.took(rank, end_seq)

    def before_rows_written(self) -> None:
        """Rows are about to be handed to wandb: which records of each rank they may hold,
        on disk first (written only when a rank's point moved)."""
        self._taken.write()

    def close(self) -> None:
        """Its files let go of (a successor reads them as they are)."""
        self._taken.close()

    def keep(self, kind: UpdateKind, data: dict[str, Any]) -> None:
        """A rank's config, summary, metric or run update: the next segment gets it again."""
        if kind is UpdateKind.CONFIG:
            self.run_data.config_update(data)
        elif kind is UpdateKind.SUMMARY:
            self.run_data.summary_update(data)
        elif kind is UpdateKind.METRIC:
            self.run_data.metric(data)
        elif kind is UpdateKind.RUN:
            self.run_data.run_update(data)

    # -- saved ---------------------------------------------------------------------------------
    def durable(
        self, writers: Iterable[RunWriter], log: Callable[[str], None]
    ) -> dict[int, int] | None:
        """Every ``_SAVE_PERIOD`` (else None): what each run's transaction log holds now; the
        ranks whose saved point moved, with the new point. The caller writes the state
        (``state``) and only then tells the ranks (a rank must never forget a record that
        a successor would not know is in the run)."""
        now = self._clock()
        if now < self._next_save:
            return None
        self._next_save = now + _SAVE_PERIOD
        moved: dict[int, int] = {}
        for writer in writers:
            if writer.sink_lost:
                continue  # rows not on disk yet are lost with wandb-core: never told saved
            try:
                rows = saved_rows(writer.sink, writer.rows)
            except Exception as exc:
                log(f"{writer.name}: could not read what the run has saved: {exc!r}")
                continue
            journal = writer.journal
            moved.update(journal.saves.durable(rows))
            journal.forget_rows_before(journal.saves.unsaved_from())
            writer.media.release(journal.saves.saved_rows)
        if self.run_data.changed:
            self.run_data.changed = False
            _private_dir.write_json(self._dir, _private_dir.RUN_DATA, self.run_data.to_json())
        return moved

    def state(
        self,
        writers: dict[int | None, RunWriter],
        ranks: Iterable[int],
        active: set[int],
        stats: dict[str, Any],
    ) -> None:
        """What a successor needs (``continuity.resume`` reads it), written before any rank is
        told its records are saved. ``active``: ranks still logging; ``stats``: the
        accounting so far (``Ledger``). In run_mode="new" (a run per rank) only the saved
        points and ranks: those runs are resumed, not de-duplicated by step."""
        before = self.before
        saved: dict[int, int] = dict(before.saved)
        for each in writers.values():
            saved.update(each.journal.saves.saved)
        state: dict[str, Any] = {
            "generation": before.generation,
            "saved": {str(k): v for k, v in saved.items()},
            # what the dead loggers' rows hold that may still be resent (a successor of this
            # one looks there too: this one may die before it sees those records saved)
            "inherited": before.dead_rows_to_carry(saved),
            "ranks": sorted(ranks),
            "active": sorted(active),
            "base": {k: stats[k] for k in ADDITIVE if k in stats},
        }
        writer = writers.get(None)
        if writer is not None:
            journal = writer.journal
            state.update(
                segments=before.segments,
                segment=_segment(writer.sink),
                segment_unsaved_from=journal.recent_from,
                # the dead logger's records: these, plus those in the rows its file holds
                records=before.records + self.duplicates + journal.records_before_recent,
                recent_rows=list(journal.recent_rows),
                # media per recent row: those of rows that never reached the file are in
                # "base" but not in the run (a successor takes them off)
                recent_media=list(journal.recent_media),
            )
        _private_dir.write_json(self._dir, _private_dir.STATE, state)

    # -- segments ------------------------------------------------------------------------------
    def continue_run(self, writer: RunWriter, log: Callable[[str], None]) -> None:
        """The run is open. An attempt of a job goes on past the earlier attempts' steps
        (``attempt.py``). A restarted logger's run gets the config, summary, metric
        definitions and name, notes and tags the ranks gave the dead one, then one line in
        the run's console that says what happened. Nothing where it could not be opened."""
        if writer.sink is None:
            return
        if self.attempt is not None:
            self.attempt.continue_run(writer, log)
        if not self.before.generation:
            return
        data, before = self.run_data, self.before
        if data.config:
            writer.update(UpdateKind.CONFIG, dict(data.config))
        for metric in data.metrics:
            writer.update(UpdateKind.METRIC, dict(metric))
        if data.summary:
            writer.update(UpdateKind.SUMMARY, dict(data.summary))
        if data.run:  # run.name / notes / tags: the new segment's run record says them too
            writer.update(UpdateKind.RUN, dict(data.run))
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
                log(f"could not note the restart in the run's console: {exc!r}")

    def earlier(self) -> dict[str, int]:
        """The accounting of the run's earlier segments (the ``Ledger`` adds it)."""
        before = self.before
        if not before.generation:
            return {}
        return {
            **before.base,
            "_funnel/records": before.records + self.duplicates,
            "_funnel/rows": before.rows,
        }

    def sync_advice(self, sink: Sink | None, online: bool) -> str | None:
        """A run continued by restarted loggers is in several segments: ``wandb sync`` uploads
        each with a command of its own, in order (one command for all skips the later ones
        after a segment cut mid-record: a killed logger's). None when there is nothing to
        say."""
        earlier = self.attempt.earlier_dirs(online) if self.attempt is not None else []
        if not (self.before.generation or earlier) or sink is None:
            return None
        try:
            segments = [s.get("segment") or {} for s in self.before.segments]
            segments.append(_segment(sink) or {})
        except Exception:
            return None
        dirs = [os.path.dirname(str(s["path"])) for s in segments if s.get("kind") == "wandb"]
        dirs = [d for d in earlier if d not in dirs] + dirs
        if online:
            # This segment uploaded itself; a dead logger's may not have uploaded its last
            # rows (its wandb-core died with it). Its file has them: the command uploads the
            # whole segment again (rows the server already has may then appear twice).
            dirs = dirs[:-1]
        if not dirs:
            return None
        flag = "--no-skip-online " if online else ""
        # One line for every segment, each its own command, in order (one command for all
        # skips the later ones after a segment cut mid-record: a killed logger's).
        commands = "    " + "; ".join(f"wandb sync {flag}{d}" for d in dirs)
        why = [f"{len(earlier)} from earlier attempts of the job"] if earlier else []
        if self.before.generation:
            why.append(f"the logger was restarted {self.before.generation} times")
        head = f"the run is in {len(dirs) + (1 if online else 0)} segments ({', '.join(why)}); "
        if online:
            return (
                head + "the dead loggers' segments may not have uploaded their last rows; "
                f"their files have them (the server may then hold those it had twice):\n"
                f"{commands}"
            )
        return head + f"to upload it, sync each in this order (one line):\n{commands}"


def saved_rows(sink: Sink | None, written: int) -> int:
    """History rows ``sink``'s transaction log holds: a sink that cannot say (not
    ``Restartable``), or no sink, holds what was written."""
    if isinstance(sink, Restartable):
        return sink.saved_rows()
    return written


def _segment(sink: Sink | None) -> dict[str, Any] | None:
    if not isinstance(sink, Restartable):
        return None
    try:
        return sink.segment()
    except Exception:
        return None
