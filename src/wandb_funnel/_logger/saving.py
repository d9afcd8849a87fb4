"""Which records of each rank are safe in the run's transaction log: what the logger tells
the ranks (``Saved``), so that they may forget them, and what a restarted logger must not
write twice.

Pure logic, tested without processes. A rank's records are tracked per batch, never per
record: ``batch`` takes the sequence number one past its last record and the highest step in
it. Every batch the logger took in before a write cycle, whose highest step is at or below
the last step that cycle released, is written (released in a row, or counted as dropped;
a late record's row goes out in the very next cycle). ``written`` notes that point, with the
number of rows written so far; ``durable`` then releases it once the transaction log holds
that many history rows (``sinks.Sink.saved_rows``).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import NamedTuple


class Checkpoint(NamedTuple):
    """A write cycle's end: rows (and records) written by then, and each rank's records
    written below these sequence numbers (only ranks that moved in this cycle)."""

    rows: int
    records: int
    seqs: dict[int, int]
    from_rows: int  # rows written when the oldest batch it saves was taken in


class SaveTracker:
    """Per-rank progress from taken in, to written, to on disk. Not thread-safe."""

    def __init__(self, saved: dict[int, int] | None = None) -> None:
        # rank -> (end_seq, max step, rows written when it was taken in), oldest first
        self._open: dict[int, deque[tuple[int, int | None, int]]] = {}
        # (max step of a rank's oldest open batch, -1 for None; rank): the ranks a write cycle
        # may move, so that it looks at those only (at 16,384 ranks a look at every rank at
        # every row cost the root 8 %, issue 38)
        self._heads: list[tuple[int, int]] = []
        self._written: dict[int, int] = {}
        self._checkpoints: deque[Checkpoint] = deque()
        self.saved: dict[int, int] = dict(saved or {})  # rank -> records below this are on disk
        self.saved_rows = 0  # history rows the transaction log holds (as last read)
        self.saved_records = 0  # records in those rows
        self._released = -1  # the last cycle's released step
        self._fresh = False  # a batch came whose steps that cycle had written

    def batch(self, rank: int, end_seq: int, max_step: int | None, rows: int = 0) -> None:
        """The logger took in a batch of ``rank`` ending before ``end_seq``, when ``rows``
        rows were written; ``max_step`` None: nothing of it will be written (dropped before
        ordering: counted already)."""
        queue = self._open.get(rank)
        if queue is None:
            queue = self._open[rank] = deque()
        if not queue:
            heapq.heappush(self._heads, (-1 if max_step is None else max_step, rank))
        queue.append((end_seq, max_step, rows))
        if max_step is None or max_step <= self._released:
            self._fresh = True  # written already, as of the last cycle: look again

    def unsaved_from(self) -> int:
        """The first row that may hold a record not yet saved: every row before it was
        written before any such record was taken in. (A restarted logger looks for resent
        records among the dead one's rows from here on.)"""
        heads = [queue[0][2] for queue in self._open.values() if queue]
        heads += [point.from_rows for point in self._checkpoints]
        return min(heads, default=self.saved_rows)

    def written(self, released_step: int, rows: int, records: int) -> None:
        """A write cycle ended: rows up to ``released_step`` are written (``rows`` rows and
        ``records`` records in all so far). Nothing to look at when no row was released
        since the last cycle and no batch came that it had written (at 16,384 ranks a look
        at every rank each cycle cost the root 5 %, issue 38)."""
        if released_step == self._released and not self._fresh:
            return
        self._released, self._fresh = released_step, False
        moved: dict[int, int] = {}
        first = rows
        heads = self._heads
        while heads and heads[0][0] <= released_step:
            _, rank = heapq.heappop(heads)
            queue = self._open[rank]
            end = None
            while queue and (queue[0][1] is None or queue[0][1] <= released_step):
                end, _, taken_at = queue.popleft()
                first = min(first, taken_at)
            if queue:
                head = queue[0][1]
                heapq.heappush(heads, (-1 if head is None else head, rank))
            if end is not None and end > self._written.get(rank, 0):
                self._written[rank] = end
                moved[rank] = end
        if moved:
            self._checkpoints.append(Checkpoint(rows, records, moved, first))

    def everything_written(self, rows: int, records: int) -> None:
        """Every batch taken in is written or counted (the run is finishing)."""
        self.written(2**63, rows, records)

    def durable(self, saved_rows: int) -> dict[int, int]:
        """The transaction log holds ``saved_rows`` history rows: the ranks whose saved
        point moved, with the new point."""
        moved: dict[int, int] = {}
        checkpoints = self._checkpoints
        while checkpoints and checkpoints[0].rows <= saved_rows:
            point = checkpoints.popleft()
            self.saved_rows, self.saved_records = point.rows, point.records
            for rank, seq in point.seqs.items():
                if seq > self.saved.get(rank, 0):
                    self.saved[rank] = moved[rank] = seq
        return moved
