"""A rank's replay buffer: the batches it sent that the logger has not yet said are saved.

Pure: no socket, no thread, no clock. ``Stream`` keeps each batch here once it has left
(``keep``), trims on the logger's ``Saved`` (``saved``), and after a logger restart says hello
with ``resume(...)`` and resends ``frames()`` (the new logger skips what the run already has;
docs/DESIGN.md, "Restarts"). Bounded: past ``max_records`` or ``max_bytes`` the oldest batches
are forgotten, never waited for; a restart then counts them as dropped (``forgotten`` says how
many records that was). The caller holds its own lock around every call.
"""

from __future__ import annotations

from collections import deque


class ReplayBuffer:
    """Sent batches, oldest first, as ``(first_seq, records, frame)``, until saved."""

    __slots__ = (
        "_batches",
        "bytes",
        "forgotten",
        "max_bytes",
        "max_records",
        "records",
        "saved_below",
    )

    def __init__(self, max_records: int, max_bytes: int) -> None:
        self._batches: deque[tuple[int, int, bytes]] = deque()
        self.records = 0  # records held
        self.bytes = 0  # frame bytes held
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.saved_below = 0  # the logger saved every record numbered below this
        self.forgotten = 0  # records pushed out by the bound before they were saved

    def __bool__(self) -> bool:
        """Whether any sent record is not yet known saved (and still held)."""
        return bool(self._batches)

    def __len__(self) -> int:
        return len(self._batches)

    def keep(self, first: int, count: int, frame: bytes) -> None:
        """Hold a sent batch of ``count`` records numbered from ``first`` until the logger
        says it is saved: two appends and a comparison, the cost ``log()`` pays for surviving
        a logger's death. Past the bound, the oldest batches are forgotten."""
        if not count:
            return
        batches = self._batches
        batches.append((first, count, frame))
        self.records += count
        self.bytes += len(frame)
        while batches and (self.records > self.max_records or self.bytes > self.max_bytes):
            _, old_count, old_frame = batches.popleft()
            self.records -= old_count
            self.bytes -= len(old_frame)
            self.forgotten += old_count

    def saved(self, seq: int) -> bool:
        """The logger saved every record below ``seq``: forget the batches wholly below it.
        False for a point at or below one already known (said late, or again)."""
        if seq <= self.saved_below:
            return False
        self.saved_below = seq
        batches = self._batches
        while batches and batches[0][0] + batches[0][1] <= seq:
            _, count, frame = batches.popleft()
            self.records -= count
            self.bytes -= len(frame)
        return True

    def resume(self, next_seq: int, inflight_first: int | None = None) -> tuple[int, int]:
        """The range a hello to a new logger resends, ``(first, until)``: from the oldest
        batch held (or ``next_seq``, nothing held), or the batch in flight if older, up to
        ``next_seq`` (the first number not yet given to a record)."""
        first = self._batches[0][0] if self._batches else next_seq
        if inflight_first is not None:
            first = min(first, inflight_first)
        return first, next_seq

    def frames(self) -> list[bytes]:
        """The frames to resend after a restart, oldest first."""
        return [frame for _, _, frame in self._batches]

    def unsaved(self, next_seq: int) -> int:
        """How many of the ``next_seq`` records numbered so far the logger has not said are
        saved: what may be missing from the run if no logger comes for them."""
        return next_seq - self.saved_below
