"""The logger's side of one run across a job's restarts (``_attempts.py`` decides
which run an attempt continues; the run opens resumed, a new segment of it).

When the run continues an earlier attempt: its ``_step`` goes on past the earlier segments'
last row (offline, wandb knows nothing of them; online, the server's ``starting_step`` says
the same), the run's console and the terminal say which restart of which job this is, and
the steps the ranks log again (a restore from a checkpoint before the step the job had
reached) are kept: wandb takes no step below its current one, so each such row is written
at the next free ``_step`` with its own step under the step key and ``_funnel/step``
(``steps.StepPlacer``'s late rows), and counted as ``_funnel/relogged_steps``. What each
attempt did is recorded beside the run as it opens and as it is finished.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from wandb_funnel._attempts import Attempt, record

if TYPE_CHECKING:
    from wandb_funnel._logger.run_writer import RunWriter
    from wandb_funnel._protocol.messages import LoggerStart


def job_attempt(start: LoggerStart) -> JobAttempt | None:
    """The attempt the owner's start message names, if any."""
    attempt = Attempt.from_wire(start.attempt)
    return JobAttempt(attempt, start.generation) if attempt is not None else None


class JobAttempt:
    """This logger's run as one attempt of a job."""

    def __init__(self, attempt: Attempt, generation: int) -> None:
        self.attempt = attempt
        self._generation = generation  # loggers before this one in this attempt

    def continue_run(self, writer: RunWriter, log: Callable[[str], None]) -> None:
        """The run is open: record the attempt, and, continuing an earlier one, go on past
        its steps and say so."""
        record(self.attempt, "running")
        if not self.attempt.continues:
            return
        from wandb_funnel.sinks.wandb.txlog import next_step

        after = max((next_step(p) for p in self.attempt.segments), default=0)
        writer.steps.next_step = max(writer.steps.next_step, after)
        writer.relog_below = writer.steps.next_step
        if self._generation:
            return  # said by this attempt's first logger
        line = self.attempt.said()
        log(f"{line}; rows go on from _step {writer.steps.next_step}")
        if writer.sink is not None:
            try:
                writer.sink.output("stderr", f"wandb-funnel: {line}\n", time.time())
            except Exception as exc:
                log(f"could not note the restart in the run's console: {exc!r}")

    def finished(self, exit_code: int) -> None:
        record(self.attempt, "done", exit_code)

    def earlier_dirs(self, online: bool) -> list[str]:
        """The run directories of the earlier attempts' segments, oldest first (online: the
        offline ones only; the others uploaded themselves)."""
        dirs = [os.path.dirname(p) for p in self.attempt.segments]
        return [d for d in dirs if not online or os.path.basename(d).startswith("offline-")]


def status_of(attempt: JobAttempt | None) -> dict[str, object]:
    """What ``wandb-funnel status`` shows of the attempt (nothing for a plain run)."""
    if attempt is None:
        return {}
    a = attempt.attempt
    return {"attempt": {"job": a.job, "restart": a.restart, "number": a.number}}
