"""The logger's one close path: every cause of a close asks here, and the first one wins.

The causes are the owner's CLOSE (the receiver's thread), a SIGTERM or SIGINT (a signal
handler on the main thread), the owner lost (the owner-watching thread) and the receiver's
death (its thread, as it dies). ``ask`` only puts on a ``queue.SimpleQueue``, which is
reentrant: safe from a signal handler that lands while the main thread is inside ``first``.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CloseRequest:
    exit_code: int
    budget: float | None  # seconds; None: the funnel's close_timeout
    why: str  # said in the summary (_funnel/exit_reason) and on the terminal
    at: float  # when it was asked (monotonic): the budget runs from here


class CloseRequests:
    """Asked from any thread or signal handler; read by the logger's loop."""

    def __init__(self) -> None:
        self._asked: queue.SimpleQueue[CloseRequest] = queue.SimpleQueue()
        self._first: CloseRequest | None = None

    def ask(self, exit_code: int, budget: float | None, why: str, at: float | None = None) -> None:
        when = time.monotonic() if at is None else at
        self._asked.put(CloseRequest(exit_code, budget, why, when))

    def first(self) -> CloseRequest | None:
        """The first request asked, once there is one (later ones are ignored). Only the
        logger's loop calls this."""
        while self._first is None:
            try:
                self._first = self._asked.get_nowait()
            except queue.Empty:
                break
        return self._first
