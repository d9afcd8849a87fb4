"""_worker.staging: a record's media staged in the one pass that packs it (``RecordPacker``,
as ``log()`` packs), within the bounds, and taken back when the record is refused. The wire
form and the logger's side: tests/test_media.py."""

from __future__ import annotations

import os
import pathlib
import threading
from typing import Any

import numpy as np
import pytest

import wandb_funnel as wf
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import RecordBatch
from wandb_funnel._worker import staging


def _stager(tmp_path: pathlib.Path, max_bytes: int = 1 << 20) -> staging.Stager:
    (tmp_path / "media").mkdir(mode=0o700, exist_ok=True)  # the owner makes it, at start
    return staging.Stager(str(tmp_path / "media"), max_bytes)


def _pack(
    stager: staging.Stager, data: dict[str, Any], max_record: int = 1 << 20
) -> tuple[dict[str, Any], list[str]]:
    """``data`` packed as ``log()`` packs it: the record as the logger reads it, and the files
    staged for it."""
    records = staging.RecordPacker(lambda: stager)
    try:
        packed = codec.encode_record(0, True, data, max_record, records.hook, records.packer)
    except BaseException:
        records.rollback()
        raise
    enc = records.take()
    batch = codec.decode(codec.encode_batch(0, [packed]), 1 << 22)
    assert isinstance(batch, RecordBatch)
    return batch.records[0][2], [] if enc is None else enc.staged


def test_a_record_without_media_stages_nothing(tmp_path: pathlib.Path) -> None:
    record, staged = _pack(_stager(tmp_path), {"loss": np.float32(0.5), "n": 1})
    assert record == {"loss": 0.5, "n": 1} and staged == []


def test_a_refused_record_takes_its_staged_files_back(tmp_path: pathlib.Path) -> None:
    stager = _stager(tmp_path)
    image = wf.Image(np.zeros((64, 64, 3), np.uint8))
    with pytest.raises(ValueError, match="over max_record_bytes"):
        _pack(stager, {"img": image, "pad": "x" * 5000}, max_record=1000)
    assert os.listdir(tmp_path / "media") == []


def test_an_item_over_max_media_bytes_is_refused_at_log(tmp_path: pathlib.Path) -> None:
    stager = _stager(tmp_path, max_bytes=100)
    with pytest.raises(ValueError, match="over max_media_bytes=100"):
        _pack(stager, {"img": wf.Image(np.random.default_rng(0).integers(0, 255, (32, 32, 3)))})
    assert os.listdir(tmp_path / "media") == []


def test_past_the_in_flight_bound_media_are_dropped_and_counted(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(staging, "MEDIA_INFLIGHT_BYTES", 300)
    stager = _stager(tmp_path)
    image = wf.Image(np.random.default_rng(0).integers(0, 255, (8, 8, 3)))  # ~250 bytes
    first, _ = _pack(stager, {"img": image})
    dropped, _ = _pack(stager, {"img": image, "loss": 1})  # the logger took nothing yet
    assert first["img"].desc["k"] == "file"
    assert dropped["img"].desc["k"] == "dropped" and dropped["loss"] == 1
    assert "waiting for the logger" in dropped["img"].desc["why"] and stager.dropped == 1
    for name in os.listdir(tmp_path / "media"):  # the logger takes the first one...
        os.unlink(tmp_path / "media" / name)
    stager._swept = 0.0  # (a sweep for taken files runs at most once a second)
    third, _ = _pack(stager, {"img": image})  # ...and there is room again
    assert third["img"].desc["k"] == "file"


def test_a_record_refused_after_staging_stages_nothing_twice_and_leaves_nothing(
    tmp_path: pathlib.Path,
) -> None:
    """The packer runs again to name the bad key; the image is staged once, then removed."""
    stager = _stager(tmp_path)
    records = staging.RecordPacker(lambda: stager)
    data = {"img": wf.Image(np.zeros((4, 4, 3), np.uint8)), "bad": object()}
    with pytest.raises(TypeError, match="'bad'"):
        codec.encode_record(0, True, data, 1 << 20, records.hook, records.packer)
    assert records.pending is not None and len(records.pending.staged) == 1
    records.rollback()
    assert records.pending is None and os.listdir(tmp_path / "media") == []


def test_staging_from_many_threads_keeps_its_count(tmp_path: pathlib.Path) -> None:
    stager = _stager(tmp_path)
    image = wf.Image(np.zeros((4, 4, 3), np.uint8))
    errors: list[BaseException] = []

    def log_many() -> None:
        try:
            for _ in range(50):
                _, staged = _pack(stager, {"img": image})
                for path in staged:
                    os.unlink(path)  # the logger took it
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=log_many) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and stager.dropped == 0
    assert stager._inflight_bytes == sum(size for size, _ in stager._inflight.values())


def test_each_thread_packs_with_a_packer_of_its_own(tmp_path: pathlib.Path) -> None:
    stager = _stager(tmp_path)
    packers = staging.RecordPackers(lambda: stager)
    seen: list[staging.RecordPacker] = []
    thread = threading.Thread(target=lambda: seen.append(packers.here))
    thread.start()
    thread.join()
    assert seen[0] is not packers.here and packers.here is packers.here
