"""A writer's finish: rows until the deadline, then the rest counted; the accounting and the
exit code always go to the sink. A recording sink stands in for wandb (pure logic)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from wandb_funnel._logger.ordering import Reorderer
from wandb_funnel._logger.reduce import RowBuilder
from wandb_funnel._logger.run_writer import RunWriter
from wandb_funnel._protocol.messages import UpdateKind
from wandb_funnel.sinks import Staging
from wandb_funnel.sinks.null import NullSink


class RecordingSink(NullSink):
    """The null sink, keeping what the writer's finish is judged by."""

    def __init__(self) -> None:
        super().__init__("run")
        self.rows: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {}
        self.exit_code: int | None = None
        self.tensorboard_dirs: list[tuple[str, bool, str]] = []
        self.steps: list[tuple[int | None, bool]] = []

    def log(
        self, row: dict[str, Any], staging: Staging | None, step: int | None, commit: bool
    ) -> None:
        self.rows.append(row)
        self.steps.append((step, commit))

    def files(self, data: dict[str, Any], staging: Staging) -> None:
        pass

    def update_summary(self, data: dict[str, Any]) -> None:
        self.summary.update(data)

    def tensorboard(self, log_dir: str, save: bool, root_dir: str) -> None:
        self.tensorboard_dirs.append((log_dir, save, root_dir))

    def info(self) -> dict[str, Any]:
        return {}

    def finish(self, exit_code: int) -> None:
        self.exit_code = exit_code


def _accounting(
    shared: dict[str, Any] | None = None, elsewhere: int = 0
) -> Callable[[RunWriter], dict[str, Any]]:
    """The run's summary as the Ledger makes it (``Ledger.for_run``), without a logger."""

    def accounting(writer: RunWriter) -> dict[str, Any]:
        return {
            **(shared or {}),
            "_funnel/records": writer.records,
            "_funnel/dropped_records": writer.dropped + elsewhere,
        }

    return accounting


def _writer_for(steps: int) -> tuple[RunWriter, RecordingSink]:
    sink = RecordingSink()
    writer = RunWriter(sink, Reorderer(1e9, 10**6), RowBuilder("auto", {}, "_step"), "run")
    writer.order.rank_attached(1)  # a rank that never logs: nothing is released before close
    writer.order.add_batch(0, [[s, True, {"x": s}] for s in range(steps)], 0.0)
    return writer, sink


def test_finish_writes_every_row_in_order_when_time_allows() -> None:
    writer, sink = _writer_for(2_500)  # more than one slice
    writer.finish(0, _accounting(), write_deadline=time.monotonic() + 60)
    assert [row["x"] for row in sink.rows] == list(range(2_500))
    assert sink.summary["_funnel/records"] == 2_500
    assert sink.summary["_funnel/dropped_records"] == 0
    assert sink.exit_code == 0


def test_finish_past_its_deadline_counts_rows_and_still_sends_the_accounting() -> None:
    writer, sink = _writer_for(50_000)
    steps: list[str] = []
    writer.finish(143, _accounting({"_funnel/ranks": 2}, 7), time.monotonic() - 1, steps.append)
    assert len(sink.rows) == 0
    # Counted in bulk: not one row was released (in order, one heap pop each) only to be
    # counted; with 500k records queued that took seconds the summary and finish needed.
    assert writer.order.last_released_step == -1
    assert sink.summary["_funnel/records"] == 0
    assert sink.summary["_funnel/dropped_records"] == 50_000 + 7
    assert sink.summary["_funnel/ranks"] == 2
    assert sink.exit_code == 143
    assert steps == [
        "run: buffered rows done (0 records written, 50000 counted)",
        "run: accounting sent",
        "run: run finished",
    ]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def test_deadline_passing_while_writing_counts_the_rest_exactly(monkeypatch: Any) -> None:
    """The soak's case: rows are being written when the deadline passes. Every record is
    written or counted, once; written rows are the lowest steps, in order; the rows left are
    not released one by one; the accounting and exit code still go out."""
    clock = FakeClock()
    monkeypatch.setattr("wandb_funnel._logger.run_writer.time", clock)
    writer, sink = _writer_for(50_000)
    writer.order.add(0, 3, True, {"late": 1}, 0.0)  # pending, not late yet
    log = sink.log

    def slow_log(
        row: dict[str, Any], staging: Staging | None, step: int | None, commit: bool
    ) -> None:  # 1 ms of the budget
        log(row, staging, step, commit)
        clock.now += 0.001

    sink.log = slow_log  # type: ignore[method-assign]
    writer.finish(0, _accounting(), write_deadline=1.5)
    written = [row["x"] for row in sink.rows]
    assert written == list(range(len(written))) and 1_000 < len(written) < 2_000
    assert sink.summary["_funnel/records"] == len(written) + 1  # step 3 has two records
    assert sink.summary["_funnel/records"] + sink.summary["_funnel/dropped_records"] == 50_001
    assert writer.order.last_released_step < 2_000  # the rest counted in bulk
    assert sink.exit_code == 0


def test_a_ranks_tensorboard_directory_reaches_the_sink_as_wandb_core_will_find_it(
    tmp_path: Any,
) -> None:
    """A relative log directory means the rank's working directory. wandb-core resolves it
    against its own (the logger's): passed as given when the two are the same (the run's
    tbrecord is then plain wandb's), made absolute when they differ. Malformed ones (a
    message is input) are left out."""
    import os

    writer, sink = _writer_for(0)
    here = os.getcwd()
    writer.update(
        UpdateKind.TENSORBOARD,
        {"log_dir": "runs/a", "save": True, "root_dir": "", "cwd": here},
        rank=0,
    )
    writer.update(
        UpdateKind.TENSORBOARD,
        {"log_dir": "runs/b", "save": False, "root_dir": "runs", "cwd": str(tmp_path)},
        rank=1,
    )
    writer.update(
        UpdateKind.TENSORBOARD,
        {"log_dir": "/abs/c", "save": True, "root_dir": "", "cwd": str(tmp_path)},
        rank=1,
    )
    for bad in (
        {"log_dir": 3, "save": True, "root_dir": "", "cwd": here},
        {"log_dir": "x", "save": "yes", "root_dir": "", "cwd": here},
        {"log_dir": "", "save": True, "root_dir": "", "cwd": here},
        {"log_dir": "x", "save": True},
    ):
        writer.update(UpdateKind.TENSORBOARD, bad, rank=1)
    assert sink.tensorboard_dirs == [
        ("runs/a", True, ""),
        (str(tmp_path / "runs/b"), False, str(tmp_path / "runs")),
        ("/abs/c", True, ""),
    ]


def test_rows_go_at_their_own_step_and_a_late_one_at_the_next_free_step(capsys: Any) -> None:
    """``_step`` follows the ranks' steps (issue 34: accelerate's ``log(step=3)`` read back
    ``_step`` 0, 1, 2); an uncommitted row stays open and what comes later at its step
    merges into it; a row below a written step takes the next free one, keeps its step under
    ``step_key``, is counted, and is said once with what to do."""
    sink = RecordingSink()
    writer = RunWriter(
        sink, Reorderer(0.0, 10**6), RowBuilder("auto", {}, "global_step"), "run", None
    )
    writer.order.add(0, 3, False, {"a": 1}, 0.0)  # log(step=3): open until a later step
    writer.order.add(0, 6, False, {"a": 2}, 0.0)
    writer.write(writer.order.pop_ready(1.0))
    writer.order.add(0, 6, True, {"b": 2}, 0.0)  # late in the reorderer, but row 6 is open
    writer.write(writer.order.pop_ready(2.0))
    writer.order.add(0, 5, True, {"c": 5}, 0.0)  # below a written row: late
    writer.order.add(0, 9, True, {"a": 3}, 0.0)
    writer.write(writer.order.pop_ready(3.0))
    assert sink.steps == [(3, False), (6, False), (6, True), (7, True), (9, True)]
    assert sink.rows[3] == {"c": 5, "global_step": 5, "_funnel/step": 5}
    assert "global_step" not in sink.rows[4]
    assert writer.rows == 4 and writer.late_records == 1 and writer.records == 5
    assert list(writer.journal.recent_rows) == [1, 2, 1, 1]
    err = capsys.readouterr().err
    assert err.count("came after a later step was written") == 1
    assert "reorder_window" in err and "_funnel/late_records" in err


def test_once_tensorboard_syncs_rows_follow_the_runs_own_steps() -> None:
    """wandb-core writes tensorboard's rows into the run at steps the funnel does not know:
    rows then go step-less, uncommitted ones merging into the next row (tensorboard's too),
    as plain wandb's ``log`` does with its tensorboard patch on (issue 34: SB3's
    ``gradient_save_freq`` histograms made 17 rows of their own at step 0)."""
    writer, sink = _writer_for(0)
    writer.update(
        UpdateKind.TENSORBOARD, {"log_dir": "/tb", "save": True, "root_dir": "", "cwd": "/"}
    )
    writer.order.add(0, 0, False, {"h": 1}, 0.0)
    writer.write(writer.order.pop_all())
    writer.order.add(0, 0, False, {"h": 2}, 0.0)  # late in the reorderer: merges all the same
    writer.write(writer.order.pop_all())
    assert sink.steps == [(None, False), (None, False)]
    assert writer.rows == 1 and writer.late_records == 0


def test_one_late_row_among_dense_steps_counts_its_records_only() -> None:
    """Steps 0, 1, 2, ... (the default counter): a late row takes the next step, so each
    later row moves up one, keeping its step; only the late row's records are late."""
    sink = RecordingSink()
    writer = RunWriter(sink, Reorderer(0.0, 10**6), RowBuilder("auto", {}, "global_step"), "run")
    for step in range(3):
        writer.order.add(0, step, True, {"x": step}, 0.0)
    writer.write(writer.order.pop_ready(1.0))
    writer.order.add(1, 1, True, {"y": 1}, 0.0)  # a rank far behind: late
    for step in range(3, 6):
        writer.order.add(0, step, True, {"x": step}, 0.0)
    writer.write(writer.order.pop_ready(2.0))
    assert [s for s, _ in sink.steps] == [0, 1, 2, 3, 4, 5, 6]
    assert [r.get("_funnel/step") for r in sink.rows] == [None, None, None, 1, 3, 4, 5]
    assert writer.late_records == 1


def test_a_row_wandb_refuses_takes_no_step() -> None:
    sink = RecordingSink()
    writer = RunWriter(sink, Reorderer(0.0, 10**6), RowBuilder("auto", {}, "global_step"), "run")
    log = sink.log

    refused: list[int | None] = []

    def refuse_step_1(
        row: dict[str, Any], staging: Staging | None, step: int | None, commit: bool
    ) -> None:
        if step == 1 and not refused:
            refused.append(step)
            raise ValueError("refused")
        log(row, staging, step, commit)

    sink.log = refuse_step_1  # type: ignore[method-assign]
    writer.order.add(0, 1, False, {"x": 1}, 0.0)
    writer.write(writer.order.pop_all())
    writer.order.add(0, 1, True, {"x": 2}, 0.0)  # late: row 1 went nowhere, and is not open
    writer.write(writer.order.pop_all())
    assert sink.steps == [(1, True)] and writer.dropped == 1  # at its own step, as wandb
    assert writer.steps.state() == (2, None) and writer.rows == 1


class DyingSink(RecordingSink):
    """wandb-core dies as the close begins: its file holds ``on_disk`` rows of those logged,
    and the summary and the finish find the connection gone."""

    def __init__(self, on_disk: int) -> None:
        super().__init__()
        self.on_disk = on_disk

    def saved_rows(self) -> int:
        return self.on_disk

    def segment(self) -> dict[str, Any]:
        return {"kind": "null"}

    def update_summary(self, data: dict[str, Any]) -> None:
        raise ConnectionResetError("Connection lost")

    def finish(self, exit_code: int) -> None:
        raise ConnectionResetError("Connection lost")


def test_rows_wandb_core_never_wrote_when_it_dies_in_the_close_are_counted() -> None:
    """No successor is started while closing: the records of the rows past what the file
    holds died with wandb-core; they are counted as dropped, not as the run's (the owner's
    DONE and final-stats.json say so: the summary cannot be written any more)."""
    sink = DyingSink(on_disk=7)
    writer = RunWriter(sink, Reorderer(1e9, 10**6), RowBuilder("auto", {}, "_step"), "run")
    writer.order.rank_attached(1)
    writer.order.add_batch(0, [[s, True, {"x": s}] for s in range(10)], 0.0)
    writer.finish(0, _accounting(), write_deadline=time.monotonic() + 60)
    assert len(sink.rows) == 10  # handed to wandb
    assert writer.records == 7 and writer.dropped == 3  # three rows never reached the file
    assert writer.sink_lost


def test_a_summary_refused_for_another_reason_counts_nothing() -> None:
    class Refusing(RecordingSink):
        def update_summary(self, data: dict[str, Any]) -> None:
            raise ValueError("not json")

    sink = Refusing()
    writer = RunWriter(sink, Reorderer(1e9, 10**6), RowBuilder("auto", {}, "_step"), "run")
    writer.order.rank_attached(1)
    writer.order.add_batch(0, [[s, True, {"x": s}] for s in range(10)], 0.0)
    writer.finish(0, _accounting(), write_deadline=time.monotonic() + 60)
    assert writer.records == 10 and writer.dropped == 0 and not writer.sink_lost
