"""A rank's replay buffer: the batches it sent that the logger has not yet said are saved,
and the media bytes sent ahead of their records (a rank on another node: BLOB frames).

Pure: no socket, no thread, no clock. ``Stream`` keeps each batch here once it has left
(``keep``), trims on the logger's ``Saved`` (``saved``), and after a logger restart says hello
with ``resume(...)`` and resends ``frames()`` (the new logger skips what the run already has;
docs/DESIGN.md, "Restarts"). Bounded: past ``max_records`` or ``max_bytes`` the oldest batches
are forgotten, never waited for; a restart then counts them as dropped (``forgotten`` says how
many records that was). The caller holds its own lock around every call.

A BLOB chunk is held as an entry of 0 records at the number of the record that names it,
``(seq, 0, frame)``: it goes (and is resent) before the batch that carries that record, and is
forgotten once that record is saved. Without it, a file in flight in a logger (or a node
logger) that died was missing when its record was resent (issue 38). A file's chunks are
kept all or none, in a byte budget of their own (``max_bytes`` again): media never push
records out, and a file is never resent in part.
"""

from __future__ import annotations

from collections import deque


class ReplayBuffer:
    """Sent batches, oldest first, as ``(first_seq, records, frame)``, until saved; and
    BLOB chunks, as ``(seq of the record naming the file, 0, frame)``."""

    __slots__ = (
        "_batches",
        "blob_bytes",
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
        self.bytes = 0  # frame bytes held (of batches)
        self.blob_bytes = 0  # BLOB chunk bytes held
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
        self._batches.append((first, count, frame))
        self.records += count
        self.bytes += len(frame)
        if self.records > self.max_records or self.bytes > self.max_bytes:
            self._trim()

    def keep_blob(self, seq: int, frames: list[bytes]) -> bool:
        """Hold one file's BLOB chunks, sent ahead of record ``seq``, until that record is
        saved; False (none held) when they do not fit the budget: the file is then missing at
        a new logger, and counted there."""
        size = sum(map(len, frames))
        if self.blob_bytes + size > self.max_bytes:
            return False
        self._batches.extend((seq, 0, frame) for frame in frames)
        self.blob_bytes += size
        return True

    def forget_blobs(self, first: int, until: int) -> None:
        """The records numbered ``first`` to ``until`` were dropped, not sent: their files'
        chunks are not held for them."""
        kept = [e for e in self._batches if e[1] or not first <= e[0] < until]
        if len(kept) != len(self._batches):
            self._batches = deque(kept)
            self.blob_bytes = sum(len(f) for _, count, f in kept if not count)

    def _trim(self) -> None:
        """Past the bound: forget the oldest entries (a chunk ahead of a forgotten batch with
        it: the loop stops only after a batch, so a file's chunks go all or none)."""
        batches = self._batches
        while batches and (self.records > self.max_records or self.bytes > self.max_bytes):
            _, old_count, old_frame = batches.popleft()
            self._forget_entry(old_count, old_frame)
            self.forgotten += old_count

    def _forget_entry(self, count: int, frame: bytes) -> None:
        if count:
            self.records -= count
            self.bytes -= len(frame)
        else:
            self.blob_bytes -= len(frame)

    def saved(self, seq: int) -> bool:
        """The logger saved every record below ``seq``: forget the batches wholly below it,
        and the chunks of the records below it. False for a point at or below one already
        known (said late, or again)."""
        if seq <= self.saved_below:
            return False
        self.saved_below = seq
        batches = self._batches
        while batches:
            first, count, frame = batches[0]
            if (first + count > seq) if count else (first >= seq):
                break
            batches.popleft()
            self._forget_entry(count, frame)
        return True

    def resume(self, next_seq: int, inflight_first: int | None = None) -> tuple[int, int]:
        """The range a hello to a new logger resends, ``(first, until)``: from the oldest
        batch held (or ``next_seq``, nothing held), or the batch in flight if older, up to
        ``next_seq`` (the first number not yet given to a record)."""
        # (A chunk may come before a batch numbered below it: the batch that carries its
        # record began before the chunk was sent.)
        first = next((f for f, count, _ in self._batches if count), next_seq)
        if inflight_first is not None:
            first = min(first, inflight_first)
        return first, next_seq

    def frames(self) -> list[bytes]:
        """The frames to resend after a restart, oldest first (each chunk before the batch
        that carries its record)."""
        return [frame for _, _, frame in self._batches]

    def unsaved(self, next_seq: int) -> int:
        """How many of the ``next_seq`` records numbered so far the logger has not said are
        saved: what may be missing from the run if no logger comes for them."""
        return next_seq - self.saved_below
