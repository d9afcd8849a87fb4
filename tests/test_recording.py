"""The recording sink and what capture_run() reads back from it (no processes)."""

from __future__ import annotations

import math
import os
import pathlib

import pytest

from wandb_funnel._constants import ENV_SINK
from wandb_funnel._logger.recording_sink import RecordingSink
from wandb_funnel._protocol.messages import MediaRef
from wandb_funnel.testing import RunCapture, capture_run


def test_what_the_sink_records_reads_back_in_order(tmp_path: pathlib.Path) -> None:
    sink = RecordingSink(str(tmp_path), {"id": "r1", "config": {"lr": 0.1}, "settings": {}})
    sink.log({"loss": 1.0, "global_step": 0})
    sink.output("stderr", "bar\r", 1.0)
    sink.output("stdout", "{'loss': 1.0}\n", 1.1)
    sink.log({"loss": math.nan, "img": MediaRef({"k": "file"}), "global_step": 1})
    sink.update_config({"bs": 8})
    sink.update_summary({"funnel/records": 2})
    sink.define_metric({"name": "loss", "summary": "min"})
    sink.finish(3)
    cap = RunCapture()
    cap._read(str(tmp_path))
    assert cap.id == "r1" and cap.exit_code == 3
    assert cap.rows == [
        {"loss": 1.0, "global_step": 0},
        {"loss": "nan", "img": {"_media": "file"}, "global_step": 1},  # JSON has no NaN
    ]
    assert cap.config == {"lr": 0.1, "bs": 8}
    assert cap.summary == {"funnel/records": 2}
    assert cap.metrics == [{"name": "loss", "summary": "min"}]
    assert cap.console == [("stderr", "bar\r"), ("stdout", "{'loss': 1.0}\n")]
    assert cap.console_text == "bar\r{'loss': 1.0}\n"


def test_a_line_cut_by_a_killed_logger_is_left_out_and_an_unfinished_run_says_so(
    tmp_path: pathlib.Path,
) -> None:
    sink = RecordingSink(str(tmp_path), {"id": "r2"})
    sink.log({"a": 1})
    sink._file.close()  # the logger is gone (its file closed by the kernel)
    with open(tmp_path / "r2.jsonl", "a", encoding="utf-8") as f:
        f.write('{"kind": "row", "data": {"a"')  # the logger died mid-line
    cap = RunCapture()
    cap._read(str(tmp_path))
    assert cap.rows == [{"a": 1}] and cap.exit_code is None


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
