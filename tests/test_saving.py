"""What the logger tells the ranks is saved, and what a restarted logger reads back: the
per-batch bookkeeping (``_logger/saving.py``) and the transaction log's tail
(``sinks/wandb/txlog.py``), as pure logic on synthetic input."""

from __future__ import annotations

import pathlib
import struct
import zlib
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from wandb_funnel._logger.saving import SaveTracker
from wandb_funnel.sinks.wandb.txlog import HISTORY_FIELD, Tail, record_kind


def test_a_batch_is_saved_once_its_rows_are_on_disk() -> None:
    saves = SaveTracker()
    saves.batch(1, end_seq=10, max_step=4, rows=0)  # rank 1: records 0..9, steps up to 4
    saves.batch(2, end_seq=5, max_step=6, rows=0)
    saves.written(released_step=4, rows=5, records=12)  # rows 0..4 written
    assert saves.durable(4) == {}  # the file holds 4 rows: not yet
    assert saves.durable(5) == {1: 10}  # rank 2's batch waits for step 6
    saves.written(released_step=6, rows=7, records=15)
    assert saves.durable(7) == {2: 5}
    assert saves.saved == {1: 10, 2: 5}


def test_a_batch_dropped_before_ordering_is_done_with_at_the_next_cycle() -> None:
    saves = SaveTracker()
    saves.batch(1, end_seq=256, max_step=None, rows=3)  # counted as dropped: nothing to write
    saves.written(released_step=-1, rows=3, records=0)
    assert saves.durable(3) == {1: 256}


def test_the_first_row_that_may_hold_an_unsaved_record() -> None:
    """A restarted logger looks for resent records among the dead one's rows from the first
    row written after the oldest unsaved batch was taken in, not only past the saved rows:
    a batch's records reach rows before the batch as a whole is written."""
    saves = SaveTracker()
    saves.batch(1, end_seq=20, max_step=19, rows=100)
    saves.written(released_step=10, rows=111, records=11)  # steps 0..10 of it are written
    assert saves.unsaved_from() == 100
    saves.written(released_step=19, rows=120, records=20)
    saves.durable(120)
    assert saves.unsaved_from() == 120 and saves.saved == {1: 20}


def test_a_saved_point_never_moves_back() -> None:
    saves = SaveTracker({1: 50})  # a restarted logger: the run has rank 1's first 50
    saves.batch(1, end_seq=40, max_step=3, rows=0)
    saves.written(released_step=3, rows=1, records=1)
    assert saves.durable(1) == {} and saves.saved == {1: 50}


def _chunk(kind: int, payload: bytes) -> bytes:
    crc = zlib.crc32(bytes([kind]) + payload)
    return struct.pack("<IHB", crc, len(payload), kind) + payload


def _record(field: int, body: bytes, num: int) -> bytes:
    """A protobuf ``Record``: num (field 1, varint), then ``field`` length-delimited."""
    out = bytes([1 << 3 | 0, num])
    return out + bytes([field << 3 | 2]) + _varint(len(body)) + body


def _varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def _log_file(records: list[bytes]) -> bytes:
    """A transaction log in LevelDB's framing: 32 KiB blocks, records cut across them."""
    block = 32 * 1024
    out = bytearray(b":W&B" + struct.pack("<HB", 0xBEE1, 0))
    for whole in records:
        record, first = whole, True
        while True:
            left = block - len(out) % block
            if left < 7:
                out += b"\0" * left
                continue
            room = left - 7
            piece, record = record[:room], record[room:]
            kind = (1 if not record else 2) if first else (4 if not record else 3)
            out += _chunk(kind, piece)
            first = False
            if not record:
                break
    return bytes(out)


def _written_by_looking_at_every_rank(
    batches: list[tuple[int, int, int | None]], cycles: list[int]
) -> list[dict[int, int]]:
    """What each write cycle moves, found the plain way: every rank's oldest batches."""
    queues: dict[int, deque[tuple[int, int | None]]] = {}
    at, moved_by_cycle = 0, []
    per_cycle = max(1, len(batches) // max(1, len(cycles)))
    for released in cycles:
        for rank, end, step in batches[at : at + per_cycle]:
            queues.setdefault(rank, deque()).append((end, step))
        at += per_cycle
        moved = {}
        for rank, queue in queues.items():
            while queue and (queue[0][1] is None or queue[0][1] <= released):
                moved[rank] = queue.popleft()[0]
        moved_by_cycle.append(moved)
    return moved_by_cycle


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 5), st.one_of(st.none(), st.integers(0, 30))), max_size=60
    ),
    cycles=st.lists(st.integers(-1, 35), min_size=1, max_size=12),
)
def test_a_write_cycle_moves_what_a_look_at_every_rank_would(
    steps: list[tuple[int, int | None]], cycles: list[int]
) -> None:
    """A cycle looks only at the ranks whose oldest open batch it may have written (a heap
    of those): it moves every rank a look at each one would, to the same point, whatever
    order the batches' steps come in (a late record's batch, one dropped before ordering)."""
    ends: dict[int, int] = {}
    batches = []
    for rank, step in steps:
        ends[rank] = ends.get(rank, 0) + 3
        batches.append((rank, ends[rank], step))
    expected = _written_by_looking_at_every_rank(batches, cycles)
    saves = SaveTracker()
    per_cycle = max(1, len(batches) // len(cycles))
    for cycle, (released, want) in enumerate(zip(cycles, expected, strict=True)):
        at = cycle * per_cycle
        for rank, end, step in batches[at : at + per_cycle]:
            saves.batch(rank, end, step, cycle)
        saves.written(released, cycle + 1, cycle + 1)
        assert saves.durable(cycle + 1) == want


def test_the_tail_counts_history_records_as_the_file_grows(tmp_path: pathlib.Path) -> None:
    history = [_record(HISTORY_FIELD, b"x" * size, n) for n, size in enumerate((10, 40_000, 5))]
    other = _record(3, b"summary", 9)  # a summary record: not a row
    assert record_kind(history[0]) == HISTORY_FIELD and record_kind(other) == 3
    data = _log_file([history[0], other, history[1], history[2]])
    path = tmp_path / "run-x.wandb"
    tail = Tail(str(path))
    assert tail.history_rows() == 0  # no file yet
    # wandb-core writes the file in pieces: a count only ever covers whole records
    for cut in (5, 100, 30_000, 32_770, len(data) - 3, len(data)):
        path.write_bytes(data[:cut])
        rows = tail.history_rows()
        whole = [history[0], other, history[1], history[2]]
        expected = sum(
            1
            for i, r in enumerate(whole)
            if record_kind(r) == HISTORY_FIELD and len(_log_file(whole[: i + 1])) <= cut
        )
        assert rows == expected, (cut, rows, expected)
    assert tail.history_rows() == 3


def test_a_staged_file_is_kept_until_its_row_is_saved(tmp_path: pathlib.Path) -> None:
    """wandb moves a row's staged file into the run; a second name (a hard link) keeps it
    until the row is saved, so that a restarted logger finds it when the record is resent."""
    from wandb_funnel._logger.media import MediaFiles
    from wandb_funnel._protocol.messages import MediaRef

    name = "12-34-deadbeef.png"
    (tmp_path / name).write_bytes(b"png")
    media = MediaFiles(str(tmp_path))
    part = {"img": MediaRef({"k": "file", "f": name})}
    media.keep([part], row=7)
    (tmp_path / name).rename(tmp_path / "moved-into-the-run.png")  # what wandb does
    assert media.path_of(name) == str(tmp_path / name)  # back under its name
    assert (tmp_path / name).read_bytes() == b"png"
    media.keep([part], row=8)
    media.release(saved_rows=8)  # row 7 saved: its second name goes; row 8's stays
    media.release(saved_rows=9)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name, "moved-into-the-run.png"]
