"""Reading wandb's transaction log (``run-<id>.wandb``) as wandb-core writes it.

The logger acknowledges a rank's records only once their rows are on disk in this file
(``Saved``), so it follows the file's tail: how many history records wandb-core has flushed
so far. A restarted logger reads the file of the run's previous segment to learn which rows
the dead one left there. No wandb import for the tail: the framing is LevelDB's log format
(a 7-byte header ``:W&B``, uint16 0xBEE1, uint8 version; then 32 KiB blocks of chunks with a
7-byte header: crc32 uint32 LE, length uint16 LE, type uint8: 1 full, 2 first, 3 middle, 4
last), and a record's kind is its protobuf field number (``Record.history`` is field 2), read
from the wire format without decoding the record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any, Final

from wandb_funnel._constants import TRUE_STEP_KEY

_HEADER: Final = 7
_BLOCK: Final = 32 * 1024
_CHUNK_HEADER: Final = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
HISTORY_FIELD: Final = 2  # wandb_internal.proto: Record { HistoryRecord history = 2; ... }


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def record_kind(payload: bytes) -> int | None:
    """The field number of a ``Record``'s payload (``HISTORY_FIELD`` for a history row): the
    first length-delimited field (``num``, field 1, is a varint and comes before it)."""
    pos = 0
    try:
        while pos < len(payload):
            tag, pos = _varint(payload, pos)
            field, wire = tag >> 3, tag & 7
            if wire == 0:
                _, pos = _varint(payload, pos)
            elif wire == 2:
                if field != 1:
                    return field
                length, pos = _varint(payload, pos)
                pos += length
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                return None
    except IndexError:
        return None
    return None


class Tail:
    """Follows one transaction log as it grows: ``history_rows()`` is how many history
    records are on disk now. Reads only what was added since the last call, and only whole
    chunks (wandb-core may be in the middle of writing the last one)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0  # the next byte to read: a chunk's start
        self._partial = b""  # a record whose first chunks were read
        self.history = 0

    def history_rows(self) -> int:
        for _ in self._new_records():
            pass
        return self.history

    def records(self) -> Iterator[bytes]:
        """Every whole record added since the last read, as protobuf payloads."""
        return self._new_records()

    def _new_records(self) -> Iterator[bytes]:
        try:
            with open(self.path, "rb") as f:
                if self._offset == 0:
                    header = f.read(_HEADER)
                    if len(header) < _HEADER:
                        return
                    if header[:4] != b":W&B":
                        raise ValueError(f"{self.path} is not a wandb transaction log")
                    self._offset = _HEADER
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        pos = 0
        base = self._offset
        while True:
            in_block = (base + pos) % _BLOCK
            left_in_block = _BLOCK - in_block
            if left_in_block < _CHUNK_HEADER:  # the block's zero trailer
                if len(data) - pos < left_in_block:
                    break
                pos += left_in_block
                continue
            if len(data) - pos < _CHUNK_HEADER:
                break
            length = int.from_bytes(data[pos + 4 : pos + 6], "little")
            kind = data[pos + 6]
            end = pos + _CHUNK_HEADER + length
            if kind == 0 and length == 0:
                break  # preallocated zeros: nothing written here yet
            if end > len(data):
                break
            chunk = data[pos + _CHUNK_HEADER : end]
            pos = end
            if kind == _FULL:
                self._partial = b""
                self._count(chunk)
                yield chunk
            elif kind == _FIRST:
                self._partial = chunk
            elif kind == _MIDDLE:
                self._partial += chunk
            elif kind == _LAST:
                record, self._partial = self._partial + chunk, b""
                self._count(record)
                yield record
        self._offset = base + pos

    def _count(self, payload: bytes) -> None:
        if record_kind(payload) == HISTORY_FIELD:
            self.history += 1


def history_steps(path: str, skip: int) -> tuple[list[Any], int]:
    """The step of each history row of a transaction log after its first ``skip`` rows (a
    restarted logger's look at what the dead one left): its ``TRUE_STEP_KEY`` where it has
    one (a late row, written at the next free step), else its ``_step``; and the step after
    its last row (0 for none). Needs wandb's protobuf classes: only a restart pays for the
    import."""
    from wandb.proto import wandb_internal_pb2

    def history(payload: bytes) -> Any:
        return wandb_internal_pb2.Record.FromString(payload).history  # type: ignore[attr-defined]

    def step_of(payload: bytes) -> Any:
        row = history(payload)
        for item in row.item:
            if (item.key or "/".join(item.nested_key)) == TRUE_STEP_KEY:
                try:
                    return json.loads(item.value_json)
                except ValueError:
                    break
        return int(row.step.num)  # the row's _step, as wandb-core wrote it

    steps: list[Any] = []
    seen = 0
    last: bytes | None = None
    for payload in Tail(path).records():
        if record_kind(payload) != HISTORY_FIELD:
            continue
        seen += 1
        last = payload
        if seen > skip:
            steps.append(step_of(payload))
    return steps, 0 if last is None else int(history(last).step.num) + 1


def next_step(path: str) -> int:
    """The step after the last history row of a transaction log (0 for none): an earlier
    attempt's segment, which the next attempt's rows go on after. Only that row is decoded
    (a long run's file holds millions)."""
    last: bytes | None = None
    for payload in Tail(path).records():
        if record_kind(payload) == HISTORY_FIELD:
            last = payload
    if last is None:
        return 0
    from wandb.proto import wandb_internal_pb2

    record = wandb_internal_pb2.Record.FromString(last)  # type: ignore[attr-defined]
    return int(record.history.step.num) + 1


def records_as_dicts(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every record of a transaction log as (its kind, protobuf's JSON of it with the
    proto's field names): what the soak harness and the tests read back where the installed
    wandb has no ``leet inspect --json`` (before 0.31; ``soak/runfile.py``)."""
    from google.protobuf.json_format import MessageToDict
    from wandb.proto import wandb_internal_pb2

    for payload in Tail(path).records():
        record = wandb_internal_pb2.Record.FromString(payload)  # type: ignore[attr-defined]
        kind = record.WhichOneof("record_type")
        if kind is not None:
            yield kind, MessageToDict(getattr(record, kind), preserving_proto_field_name=True)


def log_path(run_dir: str, run_id: str) -> str:
    """The transaction log of a run whose files directory is ``run_dir`` (``run.dir``)."""
    return os.path.join(os.path.dirname(run_dir.rstrip("/")), f"run-{run_id}.wandb")
