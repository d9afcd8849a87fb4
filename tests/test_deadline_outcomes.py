"""The close's budget object and the typed ends of a logger (``_deadline``, ``_outcomes``)."""

from __future__ import annotations

import signal

from wandb_funnel._deadline import Deadline
from wandb_funnel._outcomes import (
    LoggerExit,
    LoggerResult,
    LoggerState,
    Outcome,
    how_it_ended,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_deadline_carves_its_parts_and_runs_out() -> None:
    clock = Clock()
    close = Deadline(10.0, clock=clock)
    assert close.deadline == 110.0 and close.part(0.5) == 105.0
    assert close.keeping(2.0, at_least=0.5) == 108.0  # rows stop 2 s before the end
    assert Deadline(3.0, clock=clock).keeping(2.0, at_least=0.5) == 101.5  # half at least
    clock.now = 107.0
    assert close.remaining() == 3.0 and close.elapsed() == 7.0 and not close.expired
    clock.now = 111.0
    assert close.remaining() == 0.0 and close.expired


def test_a_negative_budget_is_none_and_a_start_may_be_given() -> None:
    clock = Clock()
    assert Deadline(-5.0, clock=clock).remaining() == 0.0
    asked_earlier = Deadline(4.0, start=98.0, clock=clock)
    assert asked_earlier.remaining() == 2.0


def test_the_logger_process_exits_with_the_runs_code_or_its_own() -> None:
    assert LoggerResult(Outcome.FINISHED, 3).process_code == 3
    assert LoggerResult(Outcome.RESTART, 0).process_code == int(LoggerExit.RESTART) == 75


def test_a_gone_logger_is_said_as_it_ended() -> None:
    assert LoggerState.of(None) is LoggerState.RUNNING
    assert LoggerState.of(0) is LoggerState.EXITED
    assert LoggerState.of(-signal.SIGKILL) is LoggerState.KILLED
    assert how_it_ended(-signal.SIGKILL) == "was killed by SIGKILL"
    assert how_it_ended(75) == "exited with code 75"
    assert how_it_ended(-200) == "was killed by signal 200"
