"""Work the logger may do less often when it grows costly: at most a ``share`` of the time.

Rewriting ``status.json`` and the state a successor reads costs little for a few ranks and
tens of milliseconds for 16,384 (issue 38): after a run that took ``t`` seconds, the next is
not due for ``t / share`` seconds (never sooner than ``floor``, never later than
``ceiling``: ``wandb-funnel status`` takes a status 10 s old for a dead funnel's).
"""

from __future__ import annotations

import time


class Pacer:
    __slots__ = ("_ceiling", "_floor", "_next", "_share")

    def __init__(self, share: float, floor: float = 0.0, ceiling: float = 5.0) -> None:
        self._share = share
        self._floor = floor
        self._ceiling = ceiling
        self._next = 0.0

    def due(self, now: float) -> bool:
        return now >= self._next

    def ran(self, now: float, began: float) -> None:
        """It ran from ``began`` (``time.monotonic()``) until now."""
        cost = time.monotonic() - began
        self._next = now + min(self._ceiling, max(self._floor, cost / self._share))
