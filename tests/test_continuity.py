"""What a restarted logger makes of what the dead one left (``_logger/continuity.py``): pure
logic and files in a temporary directory, no processes."""

from __future__ import annotations

import json
import pathlib

from wandb_funnel import _private_dir
from wandb_funnel._logger import continuity
from wandb_funnel._logger.continuity import Continuation
from wandb_funnel.sinks import RECORD


def _after(steps: set[int], taken: dict[int, int]) -> Continuation:
    return Continuation.empty()._replace(
        generation=1, steps_after_saved=frozenset(steps), taken=taken
    )


def test_a_resent_record_is_in_the_dead_rows_only_if_the_dead_logger_had_taken_it() -> None:
    """The dead logger wrote rows of steps 10-19 and had taken rank 1's records below 15
    and rank 2's below 3: rank 1's resent records of those steps (seqs 5-14 are steps
    10-19's first half) are in the run; rank 2's, of the same steps, are not: it was far
    behind (its records of those steps never reached the dead logger)."""
    before = _after(set(range(10, 20)), {1: 15, 2: 3})
    rank1 = [(step, True, {"x": step}) for step in range(10, 20)]  # seqs 5..14
    assert before.in_dead_rows(1, 15, rank1) == [True] * 10
    rank2 = [(step, True, {"y": step}) for step in range(10, 20)]  # seqs 0..9
    assert before.in_dead_rows(2, 10, rank2) == [True] * 3 + [False] * 7
    # a rank the dead logger never took anything from, and a step it never wrote
    assert before.in_dead_rows(3, 10, rank2) == [False] * 10
    assert before.in_dead_rows(1, 15, [(25, True, {})]) == [False]


def test_the_taken_points_are_read_from_the_note_of_the_logger_whose_segment_is_read(
    tmp_path: pathlib.Path,
) -> None:
    """A successor reads ``logger-taken.bin`` of the logger that wrote the state (whose
    segment's last rows it reads): generation 0's, even for the third logger when the two
    between were killed while they started (they wrote neither: found by the soak's
    logger-killed-3x, 6 of 6 with duplicates); a note of another logger says nothing."""
    directory = str(tmp_path)
    _private_dir.write_json(directory, _private_dir.STATE, {"generation": 0})
    note = continuity.TakenNote(directory, 0)
    note.took(1, 7)
    note.write()
    note.close()
    assert continuity.resume(directory, 1).taken == {1: 7}
    assert continuity.resume(directory, 3).taken == {1: 7}
    assert continuity.resume(directory, 0).taken == {}  # the first logger
    _private_dir.write_json(directory, _private_dir.STATE, {"generation": 1})
    assert continuity.resume(directory, 2).taken == {}


def test_the_taken_note_is_rewritten_in_place_and_reads_back_whole(tmp_path: pathlib.Path) -> None:
    """The note is rewritten in place, each rank in its slot: it reads back as the last
    points written (not those taken since), and a torn note reads as nothing taken (every
    record is written again: a duplicate at worst, never a loss)."""
    _private_dir.write_json(str(tmp_path), _private_dir.STATE, {"generation": 0})
    note = continuity.TakenNote(str(tmp_path), 0)
    try:
        for rank in range(50):
            note.took(rank, 1_000_000 + rank)
        note.write()
        note.took(1, 5)
        note.took(50, 9)
        note.write()
        note.took(2, 3)  # taken, never written: no row holds it
        expected = {rank: 1_000_000 + rank for rank in range(50)} | {1: 5, 50: 9}
        assert continuity.resume(str(tmp_path), 1).taken == expected
    finally:
        note.close()
    path = tmp_path / _private_dir.TAKEN
    whole = path.read_bytes()
    path.write_bytes(whole[:20])  # torn in its header
    assert continuity.resume(str(tmp_path), 1).taken == {}
    path.write_bytes(whole[:-16])  # a slot short
    assert continuity.resume(str(tmp_path), 1).taken == {}
    path.write_bytes(b"{" + whole[1:])  # not a note
    assert continuity.resume(str(tmp_path), 1).taken == {}


def test_media_of_rows_handed_to_wandb_that_never_reached_the_file_are_not_counted_twice(
    tmp_path: pathlib.Path,
) -> None:
    """The dead logger's state counted the media of each row it handed to wandb (5, of which
    the last 3 rows were unsaved, holding 1, 0 and 2 media values), but its file holds only
    the first of those 3 (wandb-core died before writing the others): their records are
    resent and their media counted again by the successor, so the state's count loses them
    (2). Records are counted the same way: those of the rows the file holds."""
    segment = tmp_path / "segment.jsonl"
    rows = [{"_step": step} for step in range(3)]  # 2 saved rows, 1 unsaved
    segment.write_text("".join(json.dumps({"kind": "row", "data": r}) + "\n" for r in rows))
    state = {
        "generation": 0,
        "segment": {"kind": RECORD, "path": str(segment)},
        "segment_unsaved_from": 2,
        "records": 4,  # in the 2 saved rows
        "recent_rows": [2, 1, 2],
        "recent_media": [1, 0, 2],
        "base": {"_funnel/media": 5, "_funnel/files": 1},
    }
    _private_dir.write_json(str(tmp_path), _private_dir.STATE, state)
    before = continuity.resume(str(tmp_path), 1)
    assert before.base == {"_funnel/media": 3, "_funnel/files": 1}
    assert before.records == 4 + 2 and before.rows == 3
    assert before.steps_after_saved == frozenset({2})
    assert before.next_step == 3  # the successor's rows go on past the dead one's


def test_run_data_carries_the_name_notes_and_tags_a_rank_set() -> None:
    """A restarted logger gives the new segment the last name, notes and tags set (issue 34),
    with the config, summary and metrics, through ``run_data.json``."""
    data = continuity.RunData({})
    data.config_update({"lr": 0.1})
    assert not data.run
    data.run_update({"name": "first"})
    data.run_update({"tags": ["a"], "name": "renamed"})
    assert data.changed
    again = continuity.RunData(json.loads(json.dumps(data.to_json())))
    assert again.run == {"name": "renamed", "tags": ["a"]}
    assert again.config == {"lr": 0.1} and not again.changed
