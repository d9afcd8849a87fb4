"""``sinks/wandb/txlog.py`` on transaction logs framed here as wandb-core frames them
(LevelDB's log format: 32 KiB blocks, records cut into first/middle/last chunks across
blocks), with wandb's own protobuf records: ``next_step`` (an earlier attempt's last step,
decoding one row), ``history_steps`` and ``records_as_dicts`` agree."""

from __future__ import annotations

import json
import pathlib
import struct

from wandb.proto import wandb_internal_pb2 as pb

from wandb_funnel.sinks.wandb.txlog import history_steps, next_step, records_as_dicts

_BLOCK = 32 * 1024


def _frame(records: list[bytes]) -> bytes:
    out = bytearray(b":W&B" + struct.pack("<HB", 0xBEE1, 0))
    for record in records:
        payload, first = record, True
        while True:
            left = _BLOCK - len(out) % _BLOCK
            if left < 7:
                out += b"\0" * left  # the block's trailer
                continue
            room = left - 7
            chunk, payload = payload[:room], payload[room:]
            kind = (1 if first else 4) if not payload else (2 if first else 3)
            out += struct.pack("<IHB", 0, len(chunk), kind) + chunk
            first = False
            if not payload:
                break
    return bytes(out)


def _row(step: int, value: float, pad: int = 0) -> bytes:
    record = pb.Record()  # type: ignore[attr-defined]
    record.history.step.num = step
    item = record.history.item.add()
    item.key, item.value_json = "loss", json.dumps(value)
    if pad:
        text = record.history.item.add()
        text.key, text.value_json = "text", json.dumps("x" * pad)
    return bytes(record.SerializeToString())


def _config() -> bytes:
    record = pb.Record()  # type: ignore[attr-defined]
    item = record.config.update.add()
    item.key, item.value_json = "lr", "0.1"
    return bytes(record.SerializeToString())


def test_the_next_step_is_the_last_rows_and_the_readers_agree(tmp_path: pathlib.Path) -> None:
    # Rows big enough to cross blocks (first, middle and last chunks), a config between.
    rows = [_row(s, 1.0 / (s + 1), pad=20_000 if s % 3 == 0 else 0) for s in range(0, 40, 2)]
    path = tmp_path / "run-x.wandb"
    path.write_bytes(_frame([rows[0], _config(), *rows[1:]]))
    assert path.stat().st_size > 3 * _BLOCK
    assert next_step(str(path)) == 39  # the last row's step is 38
    steps, after = history_steps(str(path), 0)
    assert steps == list(range(0, 40, 2)) and after == 39
    kinds = [kind for kind, _ in records_as_dicts(str(path))]
    assert kinds == ["history", "config"] + ["history"] * 19


def test_no_rows_and_no_file_give_step_0(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "run-y.wandb"
    path.write_bytes(_frame([_config()]))
    assert next_step(str(path)) == 0
    assert next_step(str(tmp_path / "missing.wandb")) == 0
