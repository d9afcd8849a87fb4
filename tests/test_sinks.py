"""The sink that WANDB_FUNNEL_SINK picks, and the null sink's accounting (no processes)."""

from __future__ import annotations

import pathlib

import pytest

from wandb_funnel import sinks
from wandb_funnel._constants import ENV_SINK
from wandb_funnel._logger.media import MediaFiles
from wandb_funnel._protocol.messages import MediaRef
from wandb_funnel.sinks.null import NullSink
from wandb_funnel.sinks.recording import RecordingSink
from wandb_funnel.sinks.refs import BadMediaError


@pytest.mark.parametrize(
    ("value", "kind", "directory"),
    [
        (None, sinks.WANDB, None),
        ("null", sinks.NULL, None),
        ("null:0.001", sinks.NULL, "0.001"),
        ("record:/x/y", sinks.RECORD, "/x/y"),
    ],
)
def test_the_variable_picks_the_sink_and_only_wandbs_has_a_service(
    monkeypatch: pytest.MonkeyPatch, value: str | None, kind: str, directory: str | None
) -> None:
    if value is None:
        monkeypatch.delenv(ENV_SINK, raising=False)
    else:
        monkeypatch.setenv(ENV_SINK, value)
    assert sinks.chosen() == (kind, directory)
    backend = sinks.backend()
    assert backend.kind == kind


def test_open_sink_opens_the_chosen_sink_without_wandb(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    said: list[str] = []
    monkeypatch.setenv(ENV_SINK, "null")
    null = sinks.open_sink({"id": "n1"}, "global_step", None, None, said.append)
    assert isinstance(null, NullSink) and null.run_id == "n1" and len(said) == 1
    monkeypatch.setenv(ENV_SINK, f"record:{tmp_path}")
    recording = sinks.open_sink({"id": "r1"}, "global_step", None, None, said.append)
    assert isinstance(recording, RecordingSink) and (tmp_path / "r1.jsonl").exists()
    recording.finish(0)


def test_a_slow_null_sink_takes_its_time_per_row_not_per_merge() -> None:
    import time

    sink = NullSink("n", row_seconds=0.05)
    t0 = time.monotonic()
    sink.log({"x": 1}, None, 0, False)
    sink.log({"y": 1}, None, 0, True)  # merged into the open row: no new row, no wait
    sink.log({"x": 2}, None, 1, True)
    assert sink.saved_rows() == 2
    assert time.monotonic() - t0 >= 0.1


def test_the_null_sink_counts_media_as_logged_and_refuses_files(tmp_path: pathlib.Path) -> None:
    staging = MediaFiles(str(tmp_path), lambda message: None)
    sink = NullSink("n")
    hist = MediaRef({"k": "histogram", "histogram": [1], "bins": [0, 1]})
    dropped = MediaRef({"k": "dropped", "what": "Image", "why": "full"})
    sink.log({"h": hist, "l": [hist, dropped], "x": 1}, staging, 0, True)
    assert staging.logged == 2 and staging.dropped == 1
    with pytest.raises(BadMediaError, match="null sink"):
        sink.files({"op": "save", "entries": []}, staging)
    staging.log_files({"op": "save", "entries": []}, sink)
    assert staging.dropped_files == 1 and staging.files == 0


@pytest.mark.parametrize(
    "value", ["record", "record:", "wnadb", "Null", "null:", "null:-1", "null:x"]
)
def test_a_value_that_names_no_sink_is_refused_not_taken_for_wandb(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(ENV_SINK, value)
    with pytest.raises(ValueError, match=ENV_SINK):
        sinks.chosen()
