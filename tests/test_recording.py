"""The recording sink and what capture_run() reads back from it (no processes)."""

from __future__ import annotations

import math
import os
import pathlib

import pytest

from wandb_funnel._constants import ENV_SINK
from wandb_funnel._logger.media import MediaFiles
from wandb_funnel._protocol.messages import MediaRef
from wandb_funnel.sinks.recording import RecordingSink
from wandb_funnel.testing import RunCapture, capture_run


def test_what_the_sink_records_reads_back_in_order(tmp_path: pathlib.Path) -> None:
    sink = RecordingSink(str(tmp_path), {"id": "r1", "config": {"lr": 0.1}, "settings": {}})
    sink.log({"loss": 1.0}, None, 0, True)
    sink.output("stderr", "bar\r", 1.0)
    sink.output("stdout", "{'loss': 1.0}\n", 1.1)
    sink.log({"loss": math.nan}, None, 2, False)  # open: a later record merges into it
    sink.log({"acc": 0.5}, None, 2, False)
    sink.update_config({"bs": 8})
    sink.update_summary({"_funnel/records": 2})
    sink.define_metric({"name": "loss", "summary": "min"})
    sink.finish(3)
    cap = RunCapture()
    cap._read(str(tmp_path))
    assert cap.id == "r1" and cap.exit_code == 3
    assert cap.rows == [
        {"loss": 1.0, "_step": 0},
        {"loss": "nan", "acc": 0.5, "_step": 2},  # JSON has no NaN; finish wrote it
    ]
    assert cap.config == {"lr": 0.1, "bs": 8}
    assert cap.summary == {"_funnel/records": 2}
    assert cap.metrics == [{"name": "loss", "summary": "min"}]
    assert cap.console == [("stderr", "bar\r"), ("stdout", "{'loss': 1.0}\n")]
    assert cap.console_text == "bar\r{'loss': 1.0}\n"
    assert cap.files == []


def test_media_are_recorded_as_descriptors_and_counted(tmp_path: pathlib.Path) -> None:
    """What a rank logged, as plain dicts shaped after wandb's: kind, caption and shape where
    the descriptor has them; a rank's dropped value is left out and counted."""
    (tmp_path / "run").mkdir()
    staging = MediaFiles(str(tmp_path), lambda message: None)
    sink = RecordingSink(str(tmp_path / "run"), {"id": "m"})
    state = {"_caption": "cat", "_width": 5, "_height": 3, "format": "png", "_size": 9}
    image = MediaRef({"k": "file", "c": "Image", "s": {**state, "_sha256": "a" * 64}})
    hist = MediaRef({"k": "histogram", "histogram": [1, 2], "bins": [0, 1, 2]})
    table = MediaRef({"k": "table", "columns": ["i", "img"], "data": [[1, image]], "mixed": False})
    dropped = MediaRef({"k": "dropped", "what": "Image", "why": "queue full"})
    bad = MediaRef({"k": "file", "c": "Artifact", "s": {}})
    row = {"img": image, "h": hist, "t": table, "gone": dropped, "bad": bad, "step": 0}
    sink.log(row, staging, 0, True)
    sink.finish(0)
    cap = RunCapture()
    cap._read(str(tmp_path / "run"))
    described = {
        "_type": "image-file",
        "caption": "cat",
        "width": 5,
        "height": 3,
        "format": "png",
        "size": 9,
        "sha256": "a" * 64,
    }
    assert cap.rows == [
        {
            "img": described,
            "h": {"_type": "histogram", "values": [1, 2], "bins": [0, 1, 2]},
            "t": {"_type": "table", "columns": ["i", "img"], "data": [[1, described]]},
            "step": 0,
            "_step": 0,
        }
    ]
    assert staging.logged == 3 and staging.dropped == 2  # one image (made once), the dropped


def test_saved_files_and_artifacts_are_recorded_by_name_and_size(tmp_path: pathlib.Path) -> None:
    (tmp_path / "run").mkdir()
    staging = MediaFiles(str(tmp_path), lambda message: None)
    (tmp_path / "1-1-0123abcd.txt").write_text("hello")
    (tmp_path / "1-2-0123abcd.bin").write_bytes(b"\0" * 10)
    sink = RecordingSink(str(tmp_path / "run"), {"id": "f"})
    staging.log_files(
        {"op": "save", "entries": [["notes/a.txt", "1-1-0123abcd.txt"]], "policy": "now"}, sink
    )
    artifact = {
        "op": "artifact",
        "name": "model",
        "type": "model",
        "entries": [["w.bin", "1-2-0123abcd.bin"]],
    }
    staging.log_files(artifact, sink)
    staging.log_files({"op": "refused", "what": "save", "why": "another node"}, sink)
    sink.finish(0)
    cap = RunCapture()
    cap._read(str(tmp_path / "run"))
    assert cap.files == [
        {"op": "save", "name": "notes/a.txt", "size": 5},
        {"op": "artifact", "name": "w.bin", "size": 10, "artifact": "model", "type": "model"},
    ]
    assert staging.files == 2 and staging.dropped_files == 1  # a refusal is still counted
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # staged copies removed


def test_a_line_cut_by_a_killed_logger_is_left_out_and_an_unfinished_run_says_so(
    tmp_path: pathlib.Path,
) -> None:
    sink = RecordingSink(str(tmp_path), {"id": "r2"})
    sink.log({"a": 1}, None, 0, True)
    sink._file.close()  # the logger is gone (its file closed by the kernel)
    with open(tmp_path / "r2.jsonl", "a", encoding="utf-8") as f:
        f.write('{"kind": "row", "data": {"a"')  # the logger died mid-line
    cap = RunCapture()
    cap._read(str(tmp_path))
    assert cap.rows == [{"a": 1, "_step": 0}] and cap.exit_code is None


def test_several_runs_are_read_by_id_and_the_shortcuts_say_so(tmp_path: pathlib.Path) -> None:
    for run_id in ("a", "b"):
        RecordingSink(str(tmp_path), {"id": run_id}).finish(0)
    cap = RunCapture()
    cap._read(str(tmp_path))
    assert sorted(cap.runs) == ["a", "b"]
    with pytest.raises(LookupError, match="2 runs were recorded"):
        _ = cap.rows


def test_captures_do_not_nest_and_the_variable_is_put_back() -> None:
    assert ENV_SINK not in os.environ
    with capture_run() as cap:
        directory = os.environ[ENV_SINK].removeprefix("record:")
        assert os.path.isdir(directory)
        with pytest.raises(RuntimeError, match="do not nest"), capture_run():
            pass
    assert ENV_SINK not in os.environ and not os.path.exists(directory)
    assert cap.runs == {}


def test_staged_media_files_are_checked_and_counted_as_wandbs_sink_counts_them(
    tmp_path: pathlib.Path,
) -> None:
    """A staged file that is missing, or named without its hash, is a dropped value, as the
    wandb sink drops it; a mask inside an image is a media value of its own."""
    (tmp_path / "run").mkdir()
    staging = MediaFiles(str(tmp_path), lambda message: None)
    sink = RecordingSink(str(tmp_path / "run"), {"id": "f"})
    for name in ("1-1-0000000a.png", "1-1-0000000b.png", "1-1-0000000c.png"):
        (tmp_path / name).write_bytes(b"png")
    sha = {"_sha256": "b" * 64}
    mask = MediaRef({"k": "file", "c": "ImageMask", "f": "1-1-0000000c.png", "s": sha})
    kept = MediaRef(
        {"k": "file", "c": "Image", "f": "1-1-0000000a.png", "s": {**sha, "_masks": {"m": mask}}}
    )
    no_hash = MediaRef({"k": "file", "c": "Image", "f": "1-1-0000000b.png", "s": {}})
    missing = MediaRef({"k": "file", "c": "Image", "f": "1-1-0000000d.png", "s": sha})
    sink.log({"kept": kept, "no_hash": no_hash, "missing": missing, "step": 0}, staging, 0, True)
    sink.finish(0)
    cap = RunCapture()
    cap._read(str(tmp_path / "run"))
    (row,) = cap.rows
    assert set(row) == {"kept", "step", "_step"}
    assert row["kept"]["masks"] == {"m": {"_type": "mask", "sha256": "b" * 64}}
    assert staging.logged == 2 and staging.dropped == 2  # the image and its mask; two drops


def test_a_run_id_that_is_not_a_plain_name_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="plain name"):
        RecordingSink(str(tmp_path), {"id": "../elsewhere"})


def test_name_notes_and_tags_a_rank_set_are_recorded_and_read_back(
    tmp_path: pathlib.Path,
) -> None:
    """A RUN update goes from the writer to the sink's ``update_run``; the recording keeps
    the last value of each, and the soak reader takes it for the run's name, notes, tags."""
    from wandb_funnel._logger.ordering import Reorderer
    from wandb_funnel._logger.reduce import RowBuilder
    from wandb_funnel._logger.run_writer import RunWriter
    from wandb_funnel._protocol.messages import UpdateKind
    from wandb_funnel.soak.runfile import read_recording

    sink = RecordingSink(str(tmp_path), {"id": "r1", "name": "first", "tags": ["t0"]})
    writer = RunWriter(sink, Reorderer(1e9, 10**6), RowBuilder("auto", {}, "_step"), "r1")
    writer.update(UpdateKind.RUN, {"name": "renamed"}, rank=1)
    writer.update(UpdateKind.RUN, {"notes": "n", "tags": ["a", "b"]}, rank=0)
    writer.update(UpdateKind.RUN, {"name": "again"}, rank=1)
    sink.finish(0)
    cap = RunCapture()
    cap._read(str(tmp_path))
    assert cap.attributes == {"name": "again", "notes": "n", "tags": ["a", "b"]}
    run = read_recording(sink.path)
    assert (run.name, run.notes, run.tags) == ("again", "n", ["a", "b"])
