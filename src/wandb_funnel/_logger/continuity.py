"""What a logger leaves for the one that replaces it, and what the new one makes of it.

The owner restarts a logger that died (``_owner/supervisor.py``). The new one continues the
same run (same id, resumed: wandb writes a new transaction log, a *segment*) and must write
every step exactly once. Two files in the funnel's private directory carry what it needs:

- ``logger-state.json``, rewritten (whole, atomically) each time ranks' records reach the
  disk, *before* the ranks are told (``Saved``): each rank's saved point, the ranks taken,
  the segments and the accounting so far. A rank resends everything it was not told is
  saved; the new logger skips what lies below the saved point (``receiver._resumed``).
- ``logger-run-data.json``, rewritten when the ranks change the run's config, summary or
  metric definitions: the new segment gets them again (wandb's offline resume does not).

What the dead logger wrote after its last state (at most a flush interval of rows) is read
from its segment's file itself: the steps of the rows there past the saved point
(``sinks.steps_after``). A row's step does not say which ranks' records it holds (a rank far
behind the others may have none in it), so a third file, ``logger-taken.bin``, is written
*before* any rows are handed to wandb: for each rank, the end of the records taken in so far
(``taken``). A resent record of such a step is in the run already only if the dead logger had
taken it in (its sequence number below ``taken``); every other resent record is written.
"""

from __future__ import annotations

import json
import os
import sys
import time
from array import array
from typing import Any, NamedTuple

from wandb_funnel import _private_dir

# The accounting a segment adds to the one before (the rest is counted afresh, or exact).
ADDITIVE = (
    "_funnel/dropped_records",
    "_funnel/late_records",
    "_funnel/junk_frames",
    "_funnel/rejected_peers",
    "_funnel/media",
    "_funnel/dropped_media",
    "_funnel/files",
    "_funnel/dropped_files",
    "_funnel/console_lines",
    "_funnel/dropped_console_lines",
    "_funnel/replayed_records",
    "_funnel/stalls",
    "_funnel/nonfinite",
)
_TAKEN_MAGIC = b"wandb-funnel taken 1\n\0\0\0"  # 24 bytes: the int64s after it stay aligned
_SETTLE = 0.5  # a dead logger's segment is final once it has not grown for this long
_SETTLE_MAX = 5.0


class Continuation(NamedTuple):
    """What a restarted logger starts from (``empty()`` for the first one)."""

    generation: int
    saved: dict[int, int]  # rank -> its records below this are in the run
    ranks: set[int]  # ranks the dead loggers handed out
    active: set[int]  # of those, ranks that had not finished: rows wait for them again
    segments: list[dict[str, Any]]  # the run's earlier segments: {"segment", "rows"}
    base: dict[str, int]  # the accounting of the earlier segments (ADDITIVE keys)
    rows: int  # rows in the earlier segments (read from their files)
    records: int  # records in those rows (as far as the last state knew)
    # The steps of the dead logger's rows from the first that may hold a record it had not
    # said was saved: a resent record of such a step is in the run already.
    steps_after_saved: frozenset[Any]
    # Of those, the steps of rows written after the dead logger's last state: the records
    # resent for them are counted as the run's (the state could not count them).
    steps_after_state: frozenset[Any]
    run_data: dict[str, Any]  # {"config", "summary", "metrics", "run"}
    # rank -> the dead logger had taken in its records below this, and no others: a resent
    # record at or above it is in none of the dead logger's rows, whatever its step.
    taken: dict[int, int]
    next_step: int = 0  # the step after the last row of the earlier segments (wandb's _step)
    # The same (steps, taken) of the loggers before the dead one whose rows past the saved
    # points may still be resent: a logger that died before it saw the records resent to it
    # saved leaves them unsaved, and their rows are in its predecessor's segment, not its own.
    inherited: tuple[tuple[frozenset[Any], dict[int, int]], ...] = ()

    @classmethod
    def empty(cls) -> Continuation:
        return cls(0, {}, set(), set(), [], {}, 0, 0, frozenset(), frozenset(), {}, {})

    def layers(self) -> list[tuple[frozenset[Any], dict[int, int]]]:
        """Every dead logger's (steps of its rows past the saved points, records taken)."""
        return [(self.steps_after_saved, self.taken), *self.inherited]

    def in_dead_rows(self, rank: int, end_seq: int, records: list[Any]) -> list[bool]:
        """For resent ``records`` of ``rank`` (sequence numbers up to ``end_seq``, each
        record's step first): which of them a row of a dead logger already holds."""
        first = end_seq - len(records)
        layers = [(steps, taken.get(rank, 0)) for steps, taken in self.layers() if steps]
        return [
            any(first + i < taken and r[0] in steps for steps, taken in layers)
            for i, r in enumerate(records)
        ]

    def dead_rows_to_carry(self, saved: dict[int, int]) -> list[dict[str, Any]]:
        """The layers a successor still needs, as plain data: a rank's records below its
        saved point are skipped before they are looked up here, so what a layer says of
        them is dropped, and a layer with nothing left goes."""
        out = []
        for steps, taken in self.layers():
            left = {r: t for r, t in taken.items() if t > saved.get(r, 0)}
            if steps and left:
                out.append({"steps": list(steps), "taken": {str(r): t for r, t in left.items()}})
        return out


class TakenNote:
    """``logger-taken.bin``: before each write of rows, rank -> the end of the records taken
    in. Binary, and rewritten in place with one ``pwrite`` of the whole note: a header (magic,
    generation, slots), then a slot per rank, ``(rank, end)`` as little-endian int64s. At
    16,384 ranks the JSON it was cost 6 ms a write, a fifth of the root's main thread
    (issue 38); this costs a copy of memory. A rank keeps its slot, so a note torn by a crash
    holds in each slot the old point or the new: an old point reads as fewer records taken,
    whose resent records the successor writes again (a duplicate at worst, never a loss), as
    does a note whose header is torn: it reads as nothing taken."""

    def __init__(self, ipc_dir: str | None, generation: int) -> None:
        self._path = os.path.join(ipc_dir, _private_dir.TAKEN) if ipc_dir else None
        self._fd: int | None = None
        self._slots: dict[int, int] = {}  # rank -> where its end is in _note
        self._note = array("q", [generation, 0])  # generation, slots; then (rank, end) pairs
        self._moved = False

    def took(self, rank: int, end_seq: int) -> None:
        """``rank``'s records below ``end_seq`` are taken in (on disk at the next write)."""
        at = self._slots.get(rank)
        if at is None:
            self._slots[rank] = len(self._note) + 1
            self._note.extend((rank, end_seq))
            self._note[1] += 1
        else:
            self._note[at] = end_seq
        self._moved = True

    def write(self) -> None:
        """On disk, when a rank's point moved since the last write."""
        if self._path is None or not self._moved:
            return
        self._moved = False
        note = self._note
        if sys.byteorder != "little":  # pragma: no cover - every platform the funnel runs on
            note = array("q", note)
            note.byteswap()
        try:
            if self._fd is None:  # opened at the first write: after the successor has read
                self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.pwrite(self._fd, _TAKEN_MAGIC + note.tobytes(), 0)
        except OSError:
            return  # the private directory is gone (the job is ending): nothing to resume

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_taken(ipc_dir: str, generation: int) -> dict[int, int]:
    """The points of ``TakenNote`` of the logger of ``generation``; nothing taken when the
    note is another logger's, missing or torn."""
    try:
        with open(os.path.join(ipc_dir, _private_dir.TAKEN), "rb") as f:
            data = f.read()
    except OSError:
        return {}
    body = data[len(_TAKEN_MAGIC) :]
    if not data.startswith(_TAKEN_MAGIC) or len(body) % 8:
        return {}
    note = array("q")
    note.frombytes(body)
    if sys.byteorder != "little":  # pragma: no cover
        note.byteswap()
    if len(note) < 2 or note[0] != generation or not 0 <= note[1] <= (len(note) - 2) // 2:
        return {}
    pairs = note[2 : 2 + 2 * note[1]]
    return dict(zip(pairs[0::2], pairs[1::2], strict=True))


def _wait_until_final(segment: dict[str, Any]) -> None:
    """The dead logger's wandb-core may still be flushing its last rows: wait (bounded)
    until its file stops growing."""
    path = segment.get("path")
    if not isinstance(path, str):
        return
    deadline = time.monotonic() + _SETTLE_MAX
    size, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        try:
            now_size = os.path.getsize(path)
        except OSError:
            return
        if now_size != size:
            size, since = now_size, time.monotonic()
        elif time.monotonic() - since >= _SETTLE:
            return
        time.sleep(0.05)


def resume(ipc_dir: str | None, generation: int) -> Continuation:
    """What the dead logger (generation ``generation - 1``) left, read now."""
    if not ipc_dir or generation == 0:
        return Continuation.empty()
    from wandb_funnel.sinks import steps_after

    state = _private_dir.read_json(ipc_dir, _private_dir.STATE)
    run_data = _private_dir.read_json(ipc_dir, _private_dir.RUN_DATA)
    # The note of the logger whose segment the state names (not always generation - 1: a
    # logger killed while it started wrote neither); another logger's says nothing of it.
    written_by = state.get("generation")
    taken = read_taken(ipc_dir, written_by) if type(written_by) is int else {}
    segments: list[dict[str, Any]] = [s for s in state.get("segments") or [] if isinstance(s, dict)]
    current = state.get("segment")
    steps: frozenset[Any] = frozenset()
    unstated: frozenset[Any] = frozenset()
    records = int(state.get("records") or 0)
    base = {k: int(v) for k, v in (state.get("base") or {}).items() if k in ADDITIVE}
    if isinstance(current, dict):
        _wait_until_final(current)
        unsaved_from = int(state.get("segment_unsaved_from") or 0)
        rows, after, next_step = steps_after(current, unsaved_from)
        steps = frozenset(s for s in after if isinstance(s, (int, float, str)))
        segments.append({"segment": current, "rows": rows, "next_step": next_step})
        recent = [int(n) for n in state.get("recent_rows") or []]
        records += sum(recent[: max(0, rows - unsaved_from)])
        # The state counted the media of every row handed to wandb; those of rows its file
        # does not hold (wandb-core died before writing them) are resent, and counted again.
        lost_media = sum(
            int(n) for n in (state.get("recent_media") or [])[max(0, rows - unsaved_from) :]
        )
        if lost_media and "_funnel/media" in base:
            base["_funnel/media"] = max(0, base["_funnel/media"] - lost_media)
        unstated = frozenset(s for s in after[len(recent) :] if isinstance(s, (int, float, str)))
    inherited = tuple(
        (
            frozenset(s for s in layer.get("steps") or [] if isinstance(s, (int, float, str))),
            {int(k): int(v) for k, v in (layer.get("taken") or {}).items()},
        )
        for layer in state.get("inherited") or []
        if isinstance(layer, dict)
    )
    return Continuation(
        generation=generation,
        saved={int(k): int(v) for k, v in (state.get("saved") or {}).items()},
        ranks={int(r) for r in state.get("ranks") or []},
        active={int(r) for r in state.get("active") or []},
        segments=segments,
        base=base,
        rows=sum(int(s.get("rows") or 0) for s in segments),
        records=records,
        steps_after_saved=steps,
        steps_after_state=unstated,
        run_data=run_data,
        taken=taken,
        next_step=max((int(s.get("next_step") or 0) for s in segments), default=0),
        inherited=inherited,
    )


class RunData:
    """The run's config, summary and metric definitions, and its name, notes and tags, as
    the ranks set them: what a restarted logger gives the new segment."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.config: dict[str, Any] = dict(data.get("config") or {})
        self.summary: dict[str, Any] = dict(data.get("summary") or {})
        self.metrics: list[dict[str, Any]] = list(data.get("metrics") or [])
        # run.name / notes / tags, the last value set of each (a RUN update's keys)
        self.run: dict[str, Any] = dict(data.get("run") or {})
        self.changed = False

    def config_update(self, data: dict[str, Any]) -> None:
        self.config.update(data)
        self.changed = True

    def summary_update(self, data: dict[str, Any]) -> None:
        for key, value in data.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                continue  # a media value: not carried over
            self.summary[key] = value
        self.changed = True

    def metric(self, data: dict[str, Any]) -> None:
        if data not in self.metrics:
            self.metrics.append(data)
            self.changed = True

    def run_update(self, data: dict[str, Any]) -> None:
        self.run.update(data)
        self.changed = True

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "summary": self.summary,
            "metrics": self.metrics,
            "run": self.run,
        }
