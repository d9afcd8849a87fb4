"""What the logger tells the ranks is saved, and what a restarted logger reads back: the
per-batch bookkeeping (``_logger/saving.py``) and the transaction log's tail
(``sinks/wandb/txlog.py``), as pure logic on synthetic input."""

from __future__ import annotations

import pathlib
import struct
import zlib

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
