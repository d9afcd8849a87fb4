"""What the receiver's thread hands the loop, in the order it took it from the socket: a rank
attached, a batch of its records, an update (config, summary, console, files, ...), a rank
ended. Plain frozen data: the loop dispatches on the type. ``EventQueue`` carries them, a
drain at a time."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any

from wandb_funnel._protocol.columns import Block
from wandb_funnel._protocol.messages import Record, UpdateKind


@dataclass(frozen=True, slots=True)
class Attached:
    rank: int
    pid: int = 0  # the rank's process (the owner's pid tells the owner's rank)


@dataclass(frozen=True, slots=True)
class Records:
    rank: int
    records: list[Record]
    end_seq: int = 0  # one past the batch's last sequence number
    replayed: bool = False  # resent to this (restarted) logger: the run may have some


@dataclass(frozen=True, slots=True)
class Update:
    rank: int
    kind: UpdateKind
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Ended:
    """A rank finished (said goodbye, with its exit code) or is gone (died)."""

    rank: int
    gone: bool
    exit_code: int = 0


@dataclass(frozen=True, slots=True)
class FoldedRecords:
    """A node logger's pre-reduced batches, taken whole (``_logger/folded.py``): per stream
    ``(rank, end_seq, top step, floor, records)``, per step ``(step, committed, records,
    states, parts)`` (``states``: a ``columns.Block`` or None; ``parts``: ``[rank, data]``,
    what no state reduces), and the
    non-finite values among the states (``said``: the first of some)."""

    streams: list[tuple[int, int, int, int, int]]
    steps: list[tuple[int, bool, int, Block | None, list[list[Any]]]]
    nonfinite: int
    said: list[list[Any]]
    records: int


Event = Attached | Records | FoldedRecords | Update | Ended


class EventQueue:
    """The receiver's events to the writer, handed over a drain at a time, bounded in records.

    ``post`` keeps an event, ``flush`` hands what was kept as one list: one wake of the writer
    for all a drain took (the writer's wake runs its whole loop, and the two threads take
    turns at the GIL: per event, that cost more than the event; issue 38). Order is kept:
    lists come out in the order they were flushed, events in the order they were posted.
    ``reserve`` takes room for a batch's records before it is posted; the writer gives it
    back with ``taken``. ``post``, ``flush`` and ``reserve`` are the receiver's thread's."""

    def __init__(self, max_records: int) -> None:
        self._lists: queue.SimpleQueue[list[Event]] = queue.SimpleQueue()
        self._outbox: list[Event] = []
        self._records = 0  # reserved: handed to the writer and not yet taken
        self._max_records = max_records
        self._room = threading.Lock()

    def fits(self, records: int) -> bool:
        """Whether ``records`` more fit now (an unlocked read: a stale answer costs a
        decode, or a ``reserve`` that says no)."""
        return self._records + records <= self._max_records

    def reserve(self, records: int) -> bool:
        """Take room for ``records``; False when the writer is that far behind."""
        with self._room:
            if self._records + records > self._max_records:
                return False
            self._records += records
        return True

    def taken(self, records: int) -> None:
        """The writer consumed ``records`` records: room for that many more."""
        with self._room:
            self._records -= records

    def post(self, event: Event) -> None:
        self._outbox.append(event)

    def flush(self) -> None:
        if self._outbox:
            self._lists.put(self._outbox)
            self._outbox = []

    def get(self, timeout: float) -> list[Event]:
        """The next list, waiting up to ``timeout`` seconds (0: not at all); raises
        ``queue.Empty`` when none came."""
        if timeout > 0:
            return self._lists.get(timeout=timeout)
        return self._lists.get_nowait()

    def empty(self) -> bool:
        return self._lists.empty()
