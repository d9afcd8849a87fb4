"""The run's step axis as the writer places rows on it (``_logger/steps.py``): pure logic."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from wandb_funnel._logger.steps import Placement, StepPlacer


def test_in_order_rows_take_their_own_step() -> None:
    steps = StepPlacer()
    assert steps.place(3, True) == Placement(3, True, False, True)
    assert steps.place(6, True) == Placement(6, True, False, True)
    assert steps.next_step == 7


def test_an_open_row_merges_what_comes_at_its_step_until_committed() -> None:
    steps = StepPlacer()
    assert steps.place(0, False) == Placement(0, False, False, True)
    assert steps.place(0, False) == Placement(0, False, False, False)
    assert steps.place(0, True) == Placement(0, True, False, False)
    # committed: the step is written, a record for it now is late
    assert steps.place(0, True) == Placement(1, True, True, True)


def test_a_late_row_takes_the_next_free_step_and_never_goes_back() -> None:
    steps = StepPlacer(next_step=10)  # a restarted logger: the dead one wrote up to 9
    assert steps.place(4, True) == Placement(10, True, True, True)
    assert steps.place(11, False) == Placement(11, False, False, True)
    assert steps.place(8, True) == Placement(12, True, True, True)  # below the open row


def test_after_tensorboard_rows_are_step_less() -> None:
    steps = StepPlacer()
    steps.place(5, True)
    steps.tensorboard()
    assert steps.place(0, False) == Placement(None, False, False, True)
    assert steps.place(0, False) == Placement(None, False, False, False)
    assert steps.place(9, True) == Placement(None, True, False, False)
    assert steps.place(2, True) == Placement(None, True, False, True)


@given(st.lists(st.tuples(st.integers(0, 50), st.booleans()), max_size=60))
def test_wandb_never_sees_a_step_below_its_current_one(rows: list[tuple[int, bool]]) -> None:
    """What wandb would drop (``log(step=S)`` below its current step) never reaches it, and a
    row is late exactly when it could not go at its own step."""
    steps = StepPlacer()
    current, open_step = 0, None
    for step, commit in rows:
        at = steps.place(step, commit)
        assert at.step is not None and at.step >= current
        assert at.late == (at.step != step)
        assert at.new_row == (at.step != open_step)
        current = at.step + 1 if at.commit else at.step
        open_step = None if at.commit else at.step
