"""``Run`` without a logger: what ``log`` refuses, it refuses before connecting; a record is
encoded once, its media too; ``run.name``, ``notes`` and ``tags`` set as wandb sets them."""

from __future__ import annotations

import os
import pathlib
import pickle
from typing import Any

import numpy as np
import pytest

import wandb_funnel as wf
from wandb_funnel import _pid
from wandb_funnel._protocol import codec
from wandb_funnel._protocol.messages import MediaRef, RecordBatch, Update, UpdateKind
from wandb_funnel._worker import media
from wandb_funnel._worker.run import AttachInfo, Run
from wandb_funnel.errors import ClientClosedError, FunnelWarning


def test_bad_data_on_first_use_raises_before_the_rank_connects() -> None:
    # Nothing listens here: a stream made anyway would be a rank holding rows back for good.
    info = AttachInfo("ipc:///nonexistent/wandb-funnel.sock", "token", "run", 1 << 20)
    run = Run(info, requested_rank=None)
    with pytest.raises(TypeError, match="keys must be str"):
        run.log({1: 2.0})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="must be a dict"):
        run.log([("loss", 1.0)])  # type: ignore[arg-type]
    assert run._stream is None


class _Updates:
    """A stream that keeps the updates a Run sends, decoded (no socket)."""

    def __init__(self) -> None:
        self.pid = _pid.current
        self.updates: list[Update] = []

    def send_control(self, frame: bytes) -> bool:
        message = codec.decode(frame, 1 << 24)
        assert isinstance(message, Update)
        self.updates.append(message)
        return True

    def close(self, reason: str, timeout: float, exit_code: int) -> None:
        pass


def _run_with_updates(run_info: dict[str, Any] | None = None) -> tuple[Run, _Updates]:
    info = AttachInfo("ipc:///nonexistent/x.sock", "token", "run", 1 << 20, run_info=run_info)
    run = Run(info, requested_rank=None)
    stream = _Updates()
    run._stream = stream  # type: ignore[assignment]
    return run, stream


def test_name_notes_and_tags_are_set_here_and_sent_to_the_run() -> None:
    run, stream = _run_with_updates({"name": "first", "notes": None, "tags": ["t0"]})
    assert (run.name, run.notes, run.tags) == ("first", None, ("t0",))
    run.name = "renamed"
    run.notes = "some notes"
    run.tags = ["a", "b"]
    assert (run.name, run.notes, run.tags) == ("renamed", "some notes", ("a", "b"))
    assert stream.updates == [
        Update(UpdateKind.RUN, {"name": "renamed"}),
        Update(UpdateKind.RUN, {"notes": "some notes"}),
        Update(UpdateKind.RUN, {"tags": ["a", "b"]}),
    ]
    run.name = None  # wandb takes None too
    assert run.name is None and stream.updates[-1].data == {"name": None}
    # A process this Run is pickled into starts from what this one set.
    child = pickle.loads(pickle.dumps(run))
    assert (child.name, child.notes, child.tags) == (None, "some notes", ("a", "b"))


def test_bad_values_raise_or_warn_where_wandb_does_and_send_nothing() -> None:
    run, stream = _run_with_updates({"tags": ["t0"]})
    with pytest.raises(ValueError, match=r"run.name must be a str or None, got int 5"):
        run.name = 5  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"run.notes must be a str"):
        run.notes = ["n"]  # type: ignore[assignment]
    with pytest.raises(TypeError, match="not iterable"):
        run.tags = 5  # type: ignore[assignment]
    with pytest.warns(FunnelWarning, match="Invalid tag detected: .* is 65 characters") as w:
        run.tags = ["x" * 65]
    assert w[0].filename == __file__  # said at the user's line
    assert run.tags == ("t0",) and stream.updates == []  # the tags the run had


def test_a_finished_run_refuses_the_setters_first() -> None:
    run, stream = _run_with_updates()
    run._finished = True
    with pytest.raises(ClientClosedError, match=r"run.name = on a finished run"):
        run.name = "late"
    with pytest.raises(ClientClosedError, match=r"run.tags = on a finished run"):
        run.tags = 5  # type: ignore[assignment]  # finished before the value is looked at
    assert stream.updates == []


class _Records:
    """A stream that keeps the records a Run pushes, and the blobs it sends (no socket)."""

    def __init__(self) -> None:
        self.pid = _pid.current
        self.frames: list[bytes] = []
        self.blobs: list[str] = []

    def push(self, frame: bytes, blobs: list[tuple[str, bytes]] | None = None) -> None:
        self.blobs += [name for name, _ in blobs or ()]  # sent ahead of the record
        self.frames.append(frame)

    def records(self) -> list[dict[str, Any]]:
        batch = codec.decode(codec.encode_batch(0, self.frames), 1 << 24)
        assert isinstance(batch, RecordBatch)
        return [data for _, _, data in batch.records]


def _run_with_records(address: str) -> tuple[Run, _Records]:
    run = Run(AttachInfo(address, "token", "run", 1 << 20), requested_rank=None)
    stream = _Records()
    run._stream = stream  # type: ignore[assignment]
    return run, stream


@pytest.mark.parametrize("where", ["this node", "another node"])
def test_a_record_is_encoded_once_its_media_too(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """One pass per record: a record with media is not first refused and then encoded again;
    its files are staged (or, from another node, sent) once."""
    (tmp_path / "media").mkdir()
    address = f"ipc://{tmp_path}/sock" if where == "this node" else "tcp://10.0.0.1:5555"
    run, stream = _run_with_records(address)
    passes: list[int] = []
    encode = codec.encode_record

    def counting(*args: Any, **kwargs: Any) -> bytes:
        passes.append(1)
        return encode(*args, **kwargs)

    monkeypatch.setattr(codec, "encode_record", counting)
    image = wf.Image(np.zeros((4, 4, 3), dtype=np.uint8))
    run.log({"loss": 0.5})
    run.log({"loss": np.float32(0.25), "image": image, "table": wf.Table(["a"], [[image]])})
    assert len(passes) == 2
    plain, with_media = stream.records()
    assert plain == {"loss": 0.5} and with_media["loss"] == 0.25
    assert isinstance(with_media["image"], MediaRef)
    staged = os.listdir(tmp_path / "media") if where == "this node" else stream.blobs
    assert len(staged) == 1  # one image object: staged once, under both keys
    with pytest.raises(TypeError, match="cannot encode value for key 'bad'"):
        run.log({"image": wf.Image(np.zeros((4, 4, 3), dtype=np.uint8)), "bad": object()})
    assert len(os.listdir(tmp_path / "media")) == (1 if where == "this node" else 0)
    assert len(stream.frames) == 2 and run.step == 2  # the refused record moved nothing


def test_a_handler_that_logs_while_media_are_staged_gets_a_record_of_its_own(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal handler runs where Python code runs: inside staging, halfway through packing
    a record. A record it logs is packed apart, and both arrive whole, the handler's first."""
    (tmp_path / "media").mkdir()
    run, stream = _run_with_records(f"ipc://{tmp_path}/sock")
    stage = media.Stager.stage_bytes

    def stage_and_log(self: media.Stager, *args: Any) -> str:
        if not stream.frames:
            run.log({"from_handler": wf.Histogram([1, 2]), "n": 1}, step=7)
        return stage(self, *args)

    monkeypatch.setattr(media.Stager, "stage_bytes", stage_and_log)
    run.log({"before": 1.0, "image": wf.Image(np.zeros((4, 4, 3), dtype=np.uint8))}, step=3)
    handlers, outer = stream.records()
    assert handlers["n"] == 1 and isinstance(handlers["from_handler"], MediaRef)
    assert outer["before"] == 1.0 and outer["image"].desc["k"] == "file"
    assert os.listdir(tmp_path / "media") == [outer["image"].desc["f"]]
