"""Where each released row goes on the run's own step axis (wandb's ``_step``).

Pure logic, no I/O: the writer asks ``place`` for every row and hands the answer to the sink.

A row is written at its own step, with the commit its ranks asked for, exactly as plain
``wandb.log(row, step=S, commit=c)`` would be: so ``_step`` is the user's step (``log(step=3)``
gives ``_step`` 3, as in plain wandb), and an uncommitted row stays open in wandb until a later
step or the finish, merging what comes after it at the same step (``commit=False`` records of a
process that never commits end as one row, as in plain wandb).

Two cases cannot be placed at their step:

* **A late row**: its step is below a row already written (a rank past ``reorder_window``).
  wandb drops ``log(step=S)`` below its current step, so the row takes the next free step
  and carries its own step under ``step_key`` (``global_step``); it is counted as late. Every
  row after it whose step is taken is placed the same way: ``_step`` never goes back.
* **Tensorboard**: once a rank syncs a tensorboard directory, wandb-core writes rows of its
  own into the run, at steps the funnel does not know. Rows are then logged without a step,
  as plain wandb does when its tensorboard patch is on (it leaves ``log``'s step out too): a
  committed row takes the run's next step, an uncommitted one merges into the next row,
  tensorboard's included.
"""

from __future__ import annotations

from typing import NamedTuple

from wandb_funnel._constants import TRUE_STEP_KEY

__all__ = ["TRUE_STEP_KEY", "Placement", "StepPlacer"]


class Placement(NamedTuple):
    """What the sink writes for one row: at ``step`` (None: the run's next step, as a
    step-less ``wandb.log``), committed or left open; ``late``: not at the row's own step
    (the row then carries that step under ``step_key``); ``new_row``: it starts a history
    row (False: it merges into the open one)."""

    step: int | None
    commit: bool
    late: bool
    new_row: bool


class StepPlacer:
    """The run's step axis as wandb keeps it: the next free step and the open row, if any."""

    def __init__(self, next_step: int = 0) -> None:
        self.next_step = next_step  # the lowest step a new row can take
        self.open_step: int | None = None  # an uncommitted row's step: it still merges
        self.follow_wandb = False  # tensorboard rows share the run: no explicit steps

    def place(self, step: int, commit: bool) -> Placement:
        """Where the row at ``step`` goes (and the state moves past it)."""
        if self.follow_wandb:
            new_row = self.open_step is None
            self.open_step = None if commit else -1  # merges into whatever row comes next
            return Placement(None, commit, False, new_row)
        if self.open_step is not None and step == self.open_step:
            if commit:
                self.open_step = None
            return Placement(step, commit, False, False)
        if step >= self.next_step:
            self.next_step = step + 1
            self.open_step = None if commit else step
            return Placement(step, commit, False, True)
        at = self.next_step
        self.next_step = at + 1
        self.open_step = None
        return Placement(at, True, True, True)

    def state(self) -> tuple[int, int | None]:
        """What ``restore`` puts back (a row wandb refused took no step)."""
        return self.next_step, self.open_step

    def restore(self, state: tuple[int, int | None]) -> None:
        self.next_step, self.open_step = state

    def tensorboard(self) -> None:
        """A rank syncs tensorboard into the run: steps are wandb-core's from now on."""
        self.follow_wandb = True
