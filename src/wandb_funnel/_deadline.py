"""A close's budget as one object, in the shape of trio's ``CancelScope``: a start, a budget,
an absolute ``deadline``, and deadlines carved out of it for the steps inside.

Every close in the funnel is a budget, never a timeout per step: the rank's (its unsaved
records, then its goodbye), the owner's (the logger's close, then its exit) and the logger's
(stragglers, rows, then the summary and wandb's finish). A step that runs long takes from
the steps after it, and the whole ends on time. Times are ``time.monotonic()`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Deadline:
    """``budget`` seconds from ``start`` (now, by default); never negative."""

    __slots__ = ("_clock", "budget", "deadline", "start")

    def __init__(
        self,
        budget: float,
        start: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self.start = clock() if start is None else start
        self.budget = max(0.0, budget)
        self.deadline = self.start + self.budget

    def remaining(self) -> float:
        """Seconds left (0 once past)."""
        return max(0.0, self.deadline - self._clock())

    def elapsed(self) -> float:
        return self._clock() - self.start

    @property
    def expired(self) -> bool:
        return self._clock() >= self.deadline

    def part(self, fraction: float) -> float:
        """The deadline of the first ``fraction`` of the budget (0.5: its half way)."""
        return self.start + self.budget * fraction

    def keeping(self, reserve: float, at_least: float = 0.0) -> float:
        """The deadline that leaves ``reserve`` seconds of the budget for what comes after,
        but not before ``at_least`` of it has passed."""
        return self.start + max(self.budget * at_least, self.budget - reserve)

    def __repr__(self) -> str:
        return f"Deadline({self.budget:.1f}s, {self.remaining():.1f}s left)"
