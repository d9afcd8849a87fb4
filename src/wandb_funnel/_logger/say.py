"""The logger's one voice on the terminal."""

from __future__ import annotations

import sys


def log_to_stderr(message: str) -> None:
    """One line on the logger's stderr (the owner's terminal), prefixed with who says it."""
    try:
        print(f"wandb-funnel logger: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        # stderr is a pipe whose reader is gone (`| tee` hit by Ctrl-C) or closed: a message
        # must never cost the run its summary and finish.
        pass


class Drops:
    """Records counted as dropped, by cause: said at once the first time for a cause, then
    in periodic totals (a writer far behind drops every batch, and 1,024 ranks may each
    drop: a line each would flood stderr). The logger's last line gives the run's total."""

    def __init__(self) -> None:
        self.total = 0
        self._unreported: dict[str, int] = {}  # not yet said, by cause

    def count(self, count: int, why: str, rank: int | None = None) -> None:
        self.total += count
        if why not in self._unreported:
            of_rank = f"rank {rank}: " if rank is not None else ""
            log_to_stderr(f"{count} records dropped ({of_rank}{why})")
            self._unreported[why] = 0
        else:
            self._unreported[why] += count

    def report(self) -> None:
        for why, count in self._unreported.items():
            if count:
                log_to_stderr(f"{count} more records dropped ({why})")
                self._unreported[why] = 0
