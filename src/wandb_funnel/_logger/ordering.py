"""The reorder buffer: merges every rank's records into one row per step, in step order.

Pure logic with the clock passed in, so it is tested without processes or sleeps.

A rank's *floor* is the lowest step it may still log at: the step of its last record, or the
one after if that record committed. The smallest pending row is released when

* it is below the floor of every rank that is logging: every rank that attached and has not
  finished or gone (a rank that attached but has not logged yet has floor 0, so that DDP ranks
  starting a few milliseconds apart still merge at step 0); a launched job's ranks that are
  *expected* but have not attached hold rows only until the first row has waited ``window``:
  past that they are taken for ranks that never call wandb (rank-0-only code, the common
  case), so that their absence costs one window at the start, not one at every row; or
* the oldest pending row has waited ``window`` seconds, and no rank has attached in the last
  ``window`` seconds; or twice ``window`` in any case (a straggler delays the run by a
  bounded time, and a rank that logs rarely cannot stall it; a Pool whose spawn workers come
  up one by one, slowly on a loaded machine, still has its first steps merged, and ranks
  that keep attaching, like DataLoader workers forked every epoch, delay rows at most
  ``2 * window``); or
* more than ``max_pending_rows`` rows are held (memory stays bounded whatever the ranks do).

Released rows come out in strictly increasing step order. A record for a step at or below the
last released one is *late*: it is released on its own row, at its own step, and flagged.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING, Any

from wandb_funnel._protocol import columns

if TYPE_CHECKING:
    from wandb_funnel._protocol.columns import Block

# A row's nodes' blocks are merged every ``_MERGE_EVERY`` seconds, and at ``_MERGE_AT`` of them
# at the latest: a block is a view of its node's frame, which it keeps in memory whole (every
# step's states of it), so memory is the blocks that came in that time; merged by time rather
# than by count, a row's merges are fewer and larger, which costs less a block (issue 38).
_MERGE_EVERY = 0.2
_MERGE_AT = 1_024


class Row:
    """One step's data: ``parts`` maps each rank to its records at that step, merged;
    ``blocks``, the node tier's pre-reduced keys of other ranks (None: none)."""

    __slots__ = ("blocks", "committed", "late", "parts", "records", "step")

    def __init__(
        self, step: int, parts: dict[int, dict[str, Any]] | None = None, late: bool = False
    ) -> None:
        self.step = step
        self.parts: dict[int, dict[str, Any]] = {} if parts is None else parts
        self.records = 0
        self.late = late
        self.committed = False  # a record at this step committed it (wandb's commit=True)
        self.blocks: list[Block] | None = None

    def __repr__(self) -> str:
        return (
            f"Row(step={self.step}, parts={self.parts!r}, records={self.records}, "
            f"late={self.late}, committed={self.committed})"
        )

    def add(self, rank: int, data: dict[str, Any], committed: bool = True) -> None:
        """Merge ``data``, which the row now owns: the receiver decoded it for this row alone,
        and the row builder copies what it returns (``test_rows_own_their_data``)."""
        if committed:
            self.committed = True
        part = self.parts.get(rank)
        if part is None:
            self.parts[rank] = data
        else:
            part.update(data)  # the same rank at the same step: later keys win, as in wandb
        self.records += 1

    def add_states(
        self,
        block: Block | None,
        parts: list[list[Any]],
        records: int,
        committed: bool,
    ) -> None:
        """Merge a node's pre-reduction of ``records`` records of its ranks: its states
        (``block``), and ``parts`` (``[rank, data]``: what of a rank's whole step no state
        reduces)."""
        if committed:
            self.committed = True
        for rank, data in parts:
            part = self.parts.get(rank)
            if part is None:
                self.parts[rank] = data
            else:
                part.update(data)
        if block is not None:
            if self.blocks is None:
                self.blocks = [block]
            else:
                self.blocks.append(block)
                if len(self.blocks) % _MERGE_AT == 0:  # (not again at once: key sets
                    self.merge_blocks()  # that differ stay apart)
        self.records += records

    def merge_blocks(self) -> None:
        """Its blocks merged into one per key set, each owning its memory."""
        if self.blocks is not None:
            self.blocks = columns.compact(self.blocks)


class Reorderer:
    """Buffers rows by step until they are safe (or too old) to release. Not thread-safe."""

    def __init__(self, window: float, max_pending_rows: int) -> None:
        if window < 0:
            raise ValueError(f"reorder window must be >= 0 seconds, got {window!r}")
        if max_pending_rows < 1:
            raise ValueError(f"max_pending_rows must be >= 1, got {max_pending_rows!r}")
        self._window = window
        self._max_rows = max_pending_rows
        self._rows: dict[int, Row] = {}
        self._heap: list[int] = []
        self._arrivals: deque[tuple[float, int]] = deque()  # (first seen, step), oldest first
        self._floors: dict[int, int] = {}  # logging ranks that may still send
        self._done: set[int] = set()  # finished or gone: their stray records hold nothing
        self._late: dict[int, Row] = {}
        self._last_released: int = -1
        self._last_attach: float | None = None  # when a rank last attached (monotonic)
        self._unattached: set[int] = set()  # expected ranks that have not attached yet
        self._first_arrival: float | None = None  # when the first row arrived
        self._unmerged: set[Row] = set()  # rows given nodes' blocks since the last merge
        self._next_merge = 0.0
        self.late_records = 0

    @property
    def pending_rows(self) -> int:
        return len(self._rows)

    @property
    def last_released_step(self) -> int:
        return self._last_released

    def add(self, rank: int, step: int, committed: bool, data: dict[str, Any], now: float) -> None:
        """Take one record of ``rank``."""
        floor = step + 1 if committed else step
        if rank not in self._done and floor > self._floors.get(rank, -1):
            self._floors[rank] = floor
        if step <= self._last_released:
            late = self._late.get(step)
            if late is None:
                late = self._late[step] = Row(step, late=True)
            late.add(rank, data, committed)
            self.late_records += 1
            return
        row = self._rows.get(step)
        if row is None:
            row = self._rows[step] = Row(step)
            self._new_row(step, now)
        row.add(rank, data, committed)

    def _new_row(self, step: int, now: float) -> None:
        heapq.heappush(self._heap, step)
        self._arrivals.append((now, step))
        if self._first_arrival is None:
            self._first_arrival = now

    def add_batch(self, rank: int, records: list[list[Any]], now: float) -> int:
        """Take ``[step, committed, data]`` records of ``rank``, in the order it logged them
        (``add`` for each, with the common case inlined: the logger's hot loop). Returns the
        highest step among them (-1 for none): the batch is written once that step is."""
        rows = self._rows
        floor = self._floors.get(rank, -1)
        tracked = rank not in self._done
        top = -1
        for step, committed, data in records:
            if step > top:
                top = step
            if step <= self._last_released:
                self.add(rank, step, committed, data, now)
                floor = self._floors.get(rank, -1)
                continue
            new_floor = step + 1 if committed else step
            if tracked and new_floor > floor:
                floor = self._floors[rank] = new_floor
            row = rows.get(step)
            if row is None:
                row = rows[step] = Row(step)
                self._new_row(step, now)
            part = row.parts.get(rank)
            if part is None:
                row.parts[rank] = data  # owned, as in Row.add
            else:
                part.update(data)
            row.records += 1
            if committed:
                row.committed = True
        return top

    def add_states(
        self,
        step: int,
        committed: bool,
        records: int,
        block: Block | None,
        parts: list[list[Any]],
        now: float,
    ) -> None:
        """Take a node's pre-reduced ``records`` records at ``step`` (its ranks' floors come
        with ``rank_floor``)."""
        if step <= self._last_released:
            row = self._late.get(step)
            if row is None:
                row = self._late[step] = Row(step, late=True)
            self.late_records += records
        else:
            row = self._rows.get(step)
            if row is None:
                row = self._rows[step] = Row(step)
                self._new_row(step, now)
        row.add_states(block, parts, records, committed)
        if block is not None:
            self._unmerged.add(row)
        if now >= self._next_merge:
            self._next_merge = now + _MERGE_EVERY
            for unmerged in self._unmerged:
                unmerged.merge_blocks()
            self._unmerged.clear()

    def rank_floor(self, rank: int, floor: int) -> None:
        """``rank`` logs nothing below ``floor`` from now on (a node's word for it)."""
        if rank not in self._done and floor > self._floors.get(rank, -1):
            self._floors[rank] = floor

    def rank_expected(self, rank: int) -> None:
        """``rank`` belongs to the job but has not attached: it holds rows from the start, so
        that a rank a little slower to call wandb still merges at step 0, until the first row
        has waited ``window`` (then it is taken for a rank that never logs)."""
        if rank not in self._done and rank not in self._floors:
            self._floors[rank] = 0
            self._unattached.add(rank)

    def rank_attached(self, rank: int, now: float | None = None) -> None:
        """``rank`` joined (at ``now``; None: a rank known from the start): until its first
        record it holds every row, and no row is overdue until ``window`` after ``now``."""
        self._unattached.discard(rank)
        if rank not in self._done:
            self._floors.setdefault(rank, 0)
        if now is not None:
            self._last_attach = now

    def _forget_unattached(self, now: float) -> None:
        """Expected ranks still unattached once the first row has waited a window never
        called wandb (or call it late: their records for written steps are then late)."""
        first = self._first_arrival
        if first is not None and now >= first + self._window:
            for rank in self._unattached:
                self._floors.pop(rank, None)
            self._unattached.clear()

    def rank_done(self, rank: int) -> None:
        """``rank`` finished or is gone: it no longer holds rows back, even if records of it
        still arrive (a dead rank's backlog)."""
        self._done.add(rank)
        self._floors.pop(rank, None)
        self._unattached.discard(rank)

    def next_deadline(self) -> float | None:
        """When the oldest pending row's window runs out (None when nothing is pending)."""
        self._drop_stale_arrivals()
        if not self._arrivals:
            return None
        arrived = self._arrivals[0][0]
        if self._last_attach is None or self._last_attach <= arrived:
            return arrived + self._window
        return min(self._last_attach, arrived + self._window) + self._window

    def pop_ready(
        self, now: float, window_applies: bool = True, limit: int | None = None
    ) -> list[Row]:
        """Release late rows, then every pending row that is safe or overdue, in step order.

        ``window_applies=False`` (the caller is behind on its input, so a straggler's records
        may already be waiting to be read) releases only safe rows and the memory bound.
        At most ``limit`` pending rows are released (late rows always are).
        """
        out = self._take_late()
        if self._unattached and window_applies:
            self._forget_unattached(now)
        floor = min(self._floors.values(), default=None)
        released = 0
        while self._heap and (limit is None or released < limit):
            step = self._heap[0]
            safe = floor is None or step < floor
            overdue = False
            if not safe:
                deadline = self.next_deadline()
                overdue = (window_applies and deadline is not None and now >= deadline) or len(
                    self._rows
                ) > self._max_rows
            if not (safe or overdue):
                break
            out.append(self._release_smallest())
            released += 1
        return out

    def pop_all(self, limit: int | None = None) -> list[Row]:
        """Release everything (at most ``limit`` pending rows, and late rows), in step order,
        whatever the floors and windows: at close."""
        out = self._take_late()
        released = 0
        while self._heap and (limit is None or released < limit):
            out.append(self._release_smallest())
            released += 1
        return out

    def drop_all(self) -> int:
        """Forget every pending and late row; returns how many records they held. At close,
        out of time: counting is cheap, releasing rows one by one in order is not."""
        records = sum(row.records for row in self._rows.values())
        records += sum(row.records for row in self._late.values())
        self._rows.clear()
        self._late.clear()
        self._heap.clear()
        self._arrivals.clear()
        self._unmerged.clear()
        return records

    def _release_smallest(self) -> Row:
        step = heapq.heappop(self._heap)
        self._last_released = step
        row = self._rows.pop(step)
        self._unmerged.discard(row)
        return row

    def _take_late(self) -> list[Row]:
        if not self._late:
            return []
        rows = [self._late[s] for s in sorted(self._late)]
        self._late.clear()
        self._unmerged.difference_update(rows)
        return rows

    def _drop_stale_arrivals(self) -> None:
        while self._arrivals and self._arrivals[0][1] not in self._rows:
            self._arrivals.popleft()
