"""Records into rows, on the logger's main thread: a rank's batch, or a node logger's
pre-reduced batches (issue 38). Each goes into its run's reorder buffer (or is counted as
dropped past the write deadline), and each stream's saved point, progress and what a
successor must know are noted, the same way for both.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from wandb_funnel._logger.events import EventQueue, FoldedRecords, Records
from wandb_funnel._logger.media import count_media

if TYPE_CHECKING:
    from wandb_funnel._logger.closing import Close
    from wandb_funnel._logger.journal import Journal
    from wandb_funnel._logger.monitor import Monitor
    from wandb_funnel._logger.runs import Runs


class Intake:
    def __init__(
        self, runs: Runs, journal: Journal, monitor: Monitor, close: Close, events: EventQueue
    ) -> None:
        self._runs = runs
        self._journal = journal
        self._monitor = monitor
        self._close = close
        self._events = events

    def take(self, event: Records | FoldedRecords) -> None:
        if isinstance(event, Records):
            self._batch(event)
        else:
            self._folded(event)

    def _batch(self, event: Records) -> None:
        now = time.monotonic()
        writer = self._runs.for_rank(event.rank)
        records, counted = self._journal.admit(
            event.rank, event.end_seq, event.records, event.replayed
        )
        for record in counted:  # in the run already, written by the dead logger
            writer.media.logged += count_media(record[2])
        top: int | None = None
        if not records:
            pass
        elif self._close.past_write_deadline():
            # Out of time to write rows: count the backlog instead of ordering it. Ordering
            # 500k queued records takes seconds, which the summary and finish need.
            writer.dropped += len(records)
        else:
            top = writer.order.add_batch(event.rank, records, now)
        writer.journal.saves.batch(event.rank, event.end_seq, top, writer.rows)
        self._journal.took(event.rank, event.end_seq)
        if records:
            self._monitor.batch(event.rank, top, len(records), now)
        self._events.taken(len(event.records))

    def _folded(self, event: FoldedRecords) -> None:
        """A node's pre-reduced steps into the rows, then each of its streams' floor, saved
        point and progress, as for a batch (a node folds only in a run every rank shares)."""
        now = time.monotonic()
        writer = self._runs.for_rank(event.streams[0][0])
        late = self._close.past_write_deadline()
        for step, committed, records, block, parts in event.steps:
            if late:
                writer.dropped += records
            else:
                writer.order.add_states(step, committed, records, block, parts, now)
        for rank, end_seq, top, floor, count in event.streams:
            writer.order.rank_floor(rank, floor)
            writer.journal.saves.batch(rank, end_seq, None if late else top, writer.rows)
            self._journal.took(rank, end_seq)
            self._monitor.batch(rank, top, count, now)
        self._monitor.folded_nonfinite(event.nonfinite, event.said)
        self._events.taken(event.records)
