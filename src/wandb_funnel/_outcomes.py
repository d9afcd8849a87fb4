"""How a logger ended, typed: what the logger's loop returns, the exit codes it uses for
itself, what the owner's close of it came to, and what the owner's supervisor makes of a
logger process that is gone (the shape of torch elastic's ``RunResult`` and ``WorkerState``).

A logger process exits with the run's exit code (the user's, any byte) when it finished
the run; the two codes below are its own. ``GAVE_UP`` (3) can be a user's code too: the
owner tells them apart by the DONE it gets (a run finished) or not (``final-stats.json``).
"""

from __future__ import annotations

import enum
import signal
from typing import NamedTuple

from wandb_funnel._constants import EXIT_LOGGER_RESTART


class LoggerExit(enum.IntEnum):
    """The logger process's own exit codes (every other code is the run's)."""

    NOT_OPENED = 1  # the run could not be opened at start (the owner's start raises)
    GAVE_UP = 3  # the close ran out of time inside wandb; the watchdog ended the process
    RESTART = EXIT_LOGGER_RESTART  # its wandb-core died: the owner starts a new logger


class Outcome(enum.Enum):
    """How the logger's loop ended."""

    FINISHED = "finished"  # the run is finished, with ``LoggerResult.exit_code``
    RESTART = "restart"  # wandb-core is gone: the owner starts a successor


class CloseOutcome(str, enum.Enum):
    """How the owner's close of a logger went (``LoggerProcess.close``)."""

    CLOSED = "closed"  # it finished the run and exited (its DONE has the accounting, if any)
    ALREADY_EXITED = "already-exited"  # it was gone before the close (a restart past the bound)
    KILLED = "killed"  # it did not exit within the close's deadline: killed


class LoggerResult(NamedTuple):
    outcome: Outcome
    exit_code: int  # the run's, when FINISHED

    @property
    def process_code(self) -> int:
        """The code the logger process exits with."""
        if self.outcome is Outcome.RESTART:
            return int(LoggerExit.RESTART)
        return self.exit_code


class LoggerState(enum.Enum):
    """A logger process seen from its supervisor."""

    RUNNING = "running"
    EXITED = "exited"  # with a code: the run's, or one of LoggerExit's
    KILLED = "killed"  # by a signal (an OOM kill, a segfault, a kill -9)

    @classmethod
    def of(cls, returncode: int | None) -> LoggerState:
        if returncode is None:
            return cls.RUNNING
        return cls.KILLED if returncode < 0 else cls.EXITED


def how_it_ended(returncode: int | None) -> str:
    """A logger process's end, in words: "was killed by SIGKILL", "exited with code 75"."""
    state = LoggerState.of(returncode)
    if state is LoggerState.RUNNING or returncode is None:
        return "exited"
    if state is LoggerState.KILLED:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"
