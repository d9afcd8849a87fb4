"""What a restarted logger makes of what the dead one left (``_logger/continuity.py``): pure
logic and files in a temporary directory, no processes."""

from __future__ import annotations

import pathlib

from wandb_funnel._logger import continuity
from wandb_funnel._logger.continuity import Continuation


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
    """A successor reads ``logger-taken.json`` of the logger that wrote the state (whose
    segment's last rows it reads): generation 0's, even for the third logger when the two
    between were killed while they started (they wrote neither: found by the soak's
    logger-killed-3x, 6 of 6 with duplicates); a note of another logger says nothing."""
    directory = str(tmp_path)
    continuity.write_json(directory, continuity.STATE_FILE, {"generation": 0})
    continuity.write_json(directory, continuity.TAKEN_FILE, {"generation": 0, "taken": {1: 7}})
    assert continuity.resume(directory, 1, "global_step").taken == {1: 7}
    assert continuity.resume(directory, 3, "global_step").taken == {1: 7}
    assert continuity.resume(directory, 0, "global_step").taken == {}  # the first logger
    continuity.write_json(directory, continuity.STATE_FILE, {"generation": 1})
    assert continuity.resume(directory, 2, "global_step").taken == {}


def test_the_taken_note_is_rewritten_in_place_and_reads_back_whole(tmp_path: pathlib.Path) -> None:
    """The note is rewritten with one pwrite: a shorter note after a longer one still reads
    back as itself (padded), and a torn note reads as nothing taken (every record is written
    again: a duplicate at worst, never a loss)."""
    continuity.write_json(str(tmp_path), continuity.STATE_FILE, {"generation": 0})
    note = continuity.TakenNote(str(tmp_path), 0)
    try:
        note.write({rank: 1_000_000 + rank for rank in range(50)})
        note.write({1: 5})
        assert continuity.resume(str(tmp_path), 1, "global_step").taken == {1: 5}
    finally:
        note.close()
    path = tmp_path / continuity.TAKEN_FILE
    path.write_bytes(path.read_bytes()[:20])  # torn
    assert continuity.resume(str(tmp_path), 1, "global_step").taken == {}
