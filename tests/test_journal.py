"""The Journal in process: a logger's writers and journal on a recording sink, a fake clock, a
"death" (the objects dropped, whatever was on disk kept), and a successor built from what
the dead one left. Every record is written once: none twice, none lost."""

from __future__ import annotations

import collections
import glob
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wandb_funnel import _private_dir
from wandb_funnel._logger import continuity
from wandb_funnel._logger.journal import Journal, RunJournal, saved_rows
from wandb_funnel._logger.ordering import Reorderer
from wandb_funnel._logger.reduce import RowBuilder
from wandb_funnel._logger.run_writer import RunWriter
from wandb_funnel._protocol.messages import UpdateKind
from wandb_funnel.sinks import Restartable
from wandb_funnel.sinks.null import NullSink
from wandb_funnel.sinks.recording import RecordingSink, rows_in

RUN = "r1"


@pytest.fixture(autouse=True, scope="module")
def _segments_final_at_once() -> Iterator[None]:
    """A dead logger's file is final here when the successor starts (no wandb-core flushing
    behind it): no waiting for it to settle."""
    settle = continuity._SETTLE
    continuity._SETTLE = 0.0
    yield
    continuity._SETTLE = settle


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Rank:
    """A rank's side, as far as the journal sees it: records with sequence numbers, kept
    until told saved, resent (all of them) after a logger's death."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.sent: list[tuple[int, list[Any]]] = []  # (seq, record), not yet told saved
        self.seq = 0

    def log(self, step: int) -> tuple[int, list[list[Any]]]:
        record = [step, True, {f"w{self.rank}": step}]
        self.sent.append((self.seq, record))
        self.seq += 1
        return self.seq, [record]

    def saved(self, upto: int) -> None:
        self.sent = [(s, r) for s, r in self.sent if s >= upto]

    def resend(self) -> tuple[int, list[list[Any]]]:
        return self.seq, [r for _, r in self.sent]


class Logger:
    """The parts of the loop that the journal takes part in, for one run."""

    def __init__(self, directory: str, generation: int, clock: Clock) -> None:
        self.dir = directory
        before = continuity.resume(directory, generation)
        self.journal = Journal(directory, before, clock)
        self.sink = RecordingSink(directory, {"id": RUN}, generation)
        self.writer = RunWriter(
            self.sink, Reorderer(0.0, 10**6), RowBuilder("auto", {}, "global_step"), RUN
        )
        self.writer.journal = self.journal.for_run(main=True)
        self.writer.steps.next_step = before.next_step
        if generation:
            self.journal.continue_run(self.writer, lambda line: None)
        self.journal.state({None: self.writer}, [1, 2], {1, 2}, {})

    def take(self, rank: int, end_seq: int, records: list[Any], replayed: bool = False) -> None:
        records, _ = self.journal.admit(rank, end_seq, records, replayed)
        top = self.writer.order.add_batch(rank, records, 0.0) if records else None
        self.writer.journal.saves.batch(rank, end_seq, top, self.writer.rows)
        self.journal.took(rank, end_seq)

    def write(self, now: float) -> None:
        rows = self.writer.order.pop_ready(now, True, 10**6)
        if rows:
            self.journal.before_rows_written()
        self.writer.write(rows)
        self.writer.journal.saves.written(
            self.writer.order.last_released_step, self.writer.rows, self.writer.records
        )

    def die(self) -> None:
        """What a SIGKILL leaves: the files as they are (their descriptors let go of)."""
        self.sink._file.close()
        self.journal.close()

    def saved(self) -> dict[int, int]:
        moved = self.journal.durable([self.writer], lambda line: None) or {}
        if moved:  # the state first: then the ranks may be told
            self.journal.state({None: self.writer}, [1, 2], {1, 2}, {})
        return moved


def _rows(directory: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(glob.glob(os.path.join(directory, f"{RUN}*.jsonl")), key=len):
        out.extend(rows_in(path))
    return out


def _steps_of(rows: list[dict[str, Any]], key: str) -> collections.Counter[Any]:
    return collections.Counter(row.get("_funnel/step", row["_step"]) for row in rows if key in row)


def _run_with_a_death(directory: str, steps: int, die_at: int, unsaved: int) -> None:
    """Two ranks log ``steps`` steps; the logger writes each step as it comes, tells the
    ranks what is saved up to ``die_at - unsaved``, writes on to ``die_at`` and dies; a
    successor takes the ranks' resends and the rest."""
    clock = Clock()
    ranks = {1: Rank(1), 2: Rank(2)}
    first = Logger(directory, 0, clock)
    for step in range(die_at):
        for rank in ranks.values():
            first.take(rank.rank, *rank.log(step))
        clock.now += 1.0
        first.write(clock.now)
        if step < die_at - unsaved:
            for number, upto in first.saved().items():
                ranks[number].saved(upto)
    first.die()  # nothing more of the first logger's; its files are what is left
    second = Logger(directory, 1, clock)
    for rank in ranks.values():
        second.take(rank.rank, *rank.resend(), replayed=True)
    for step in range(die_at, steps):
        for rank in ranks.values():
            second.take(rank.rank, *rank.log(step))
    clock.now += 1.0
    second.write(clock.now)
    second.writer.finish(0, lambda w: {}, None)
    second.journal.close()


def test_every_record_once_after_a_death_with_rows_written_past_the_saved_point(
    tmp_path: Any,
) -> None:
    _run_with_a_death(str(tmp_path), steps=40, die_at=25, unsaved=6)
    rows = _rows(str(tmp_path))
    for key in ("w1", "w2"):
        seen = _steps_of(rows, key)
        assert sorted(seen) == list(range(40)), key
        assert set(seen.values()) == {1}, f"{key}: twice {[s for s, n in seen.items() if n > 1]}"


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 30), st.integers(0, 30))
def test_every_record_once_wherever_the_death_comes(die_at: int, unsaved: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        _run_with_a_death(directory, steps=35, die_at=die_at, unsaved=min(unsaved, die_at))
        rows = _rows(directory)
        for key in ("w1", "w2"):
            seen = _steps_of(rows, key)
            assert sorted(seen) == list(range(35)) and set(seen.values()) == {1}


def test_the_state_is_on_disk_before_the_ranks_may_forget(tmp_path: Any) -> None:
    """``durable`` says which ranks moved; the saved points a successor reads are at least
    those (the loop writes the state before it tells the ranks)."""
    clock = Clock()
    logger = Logger(str(tmp_path), 0, clock)
    rank = Rank(1)
    for step in range(5):
        logger.take(1, *rank.log(step))
    clock.now = 1.0
    logger.write(clock.now)
    moved = logger.saved()
    assert moved == {1: 5}
    state = _private_dir.read_json(str(tmp_path), _private_dir.STATE)
    assert state["saved"] == {"1": 5}
    assert state["segment"] == {"kind": "record", "path": logger.sink.path}
    logger.die()


def test_durable_looks_at_most_once_a_save_period(tmp_path: Any) -> None:
    clock = Clock()
    logger = Logger(str(tmp_path), 0, clock)
    assert logger.journal.durable([logger.writer], lambda line: None) == {}
    assert logger.journal.durable([logger.writer], lambda line: None) is None  # too soon
    clock.now += 0.25
    assert logger.journal.durable([logger.writer], lambda line: None) == {}
    logger.die()


def test_a_restarted_logger_gives_the_new_segment_the_runs_data_and_counts_earlier_rows(
    tmp_path: Any,
) -> None:
    clock = Clock()
    first = Logger(str(tmp_path), 0, clock)
    first.journal.keep(UpdateKind.CONFIG, {"lr": 0.1})
    first.journal.keep(UpdateKind.RUN, {"name": "n"})
    rank = Rank(1)
    for step in range(3):
        first.take(1, *rank.log(step))
    clock.now = 1.0
    first.write(clock.now)
    first.saved()
    first.die()
    second = Logger(str(tmp_path), 1, clock)
    lines = [e for e in _entries(second.sink.path) if e["kind"] in ("config", "run", "console")]
    assert [e["kind"] for e in lines] == ["config", "run", "console"]
    assert lines[0]["data"] == {"lr": 0.1} and lines[1]["data"] == {"name": "n"}
    assert "the logger was restarted (restart 1)" in str(lines[2]["data"])
    assert second.journal.earlier()["_funnel/rows"] == 3
    assert second.writer.steps.next_step == 3  # the run's _step goes on
    second.die()


def test_sync_advice_names_every_segment_in_order(tmp_path: Any) -> None:
    journal = Journal(str(tmp_path))
    assert journal.sync_advice(NullSink(RUN), online=False) is None  # one segment: nothing
    before = continuity.Continuation.empty()._replace(
        generation=1,
        segments=[{"segment": {"kind": "wandb", "path": "/w/run-a/run-x.wandb"}, "rows": 3}],
    )

    class Segmented(NullSink):
        def segment(self) -> dict[str, Any]:
            return {"kind": "wandb", "path": "/w/run-b/run-x.wandb"}

    advice = Journal(str(tmp_path), before).sync_advice(Segmented(RUN), online=False)
    assert advice is not None
    assert advice.index("wandb sync /w/run-a") < advice.index("wandb sync /w/run-b")
    online = Journal(str(tmp_path), before).sync_advice(Segmented(RUN), online=True)
    assert online is not None and "--no-skip-online /w/run-a" in online and "run-b" not in online


def test_a_sink_that_cannot_say_what_is_on_disk_counts_what_was_written() -> None:
    class Plain:
        pass

    assert not isinstance(Plain(), Restartable)
    assert saved_rows(Plain(), 7) == 7  # type: ignore[arg-type]
    assert isinstance(NullSink(RUN), Restartable)


def test_run_journal_forgets_only_rows_before_the_first_unsaved() -> None:
    journal = RunJournal()
    for records in (2, 1, 3):
        journal.row_written(records, 0, new_row=True)
    journal.row_written(1, 2, new_row=False)  # merged into the open row, with 2 media
    assert list(journal.recent_rows) == [2, 1, 4] and list(journal.recent_media) == [0, 0, 2]
    journal.forget_rows_before(2)
    assert journal.recent_from == 2 and journal.records_before_recent == 3
    assert list(journal.recent_rows) == [4]


def _entries(path: str) -> list[dict[str, Any]]:
    import json

    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]
