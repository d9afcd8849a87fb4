"""Ledger: every ``_funnel/*`` figure of a run, computed in one place.

The figures come from the parts that count (each writer's rows, records and drops, the
receiver's frames and peers, the health's stalls and NaNs, the media and console lines);
the ledger adds them up, adds the run's earlier segments after a logger's restart (the
``Journal`` knows those), and says on the terminal what did not go as logged. The run's
summary, the owner's DONE, ``final-stats.json`` and ``status.json`` all take their figures
from here, so they always agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from wandb_funnel.sinks import Degradable

if TYPE_CHECKING:
    from wandb_funnel._logger.health import Health
    from wandb_funnel._logger.journal import Journal
    from wandb_funnel._logger.receiver import Receiver
    from wandb_funnel._logger.run_writer import RunWriter

# The accounting that says something went missing or wrong: said on the terminal when not 0.
REPORTED = (
    "_funnel/dropped_records",
    "_funnel/late_records",
    "_funnel/dropped_media",
    "_funnel/dropped_files",
    "_funnel/dropped_console_lines",
    "_funnel/dead_ranks",
    "_funnel/failed_ranks",
    "_funnel/junk_frames",
    "_funnel/rejected_peers",
    "_funnel/stalls",
    "_funnel/nonfinite",
)
# Counted per run by each writer itself (run_mode="new" has a run per rank); everything else
# is the funnel's, the same in every run.
PER_RUN = ("_funnel/records", "_funnel/rows", "_funnel/late_records", "_funnel/dropped_records")


class Ledger:
    """The funnel's accounting, read from the counters of the parts that keep them."""

    def __init__(self, receiver: Receiver, health: Health, journal: Journal) -> None:
        self._receiver = receiver
        self._health = health
        self._journal = journal
        self.failed: dict[int, int] = {}  # rank -> the non-zero exit code it reported

    def funnel(self, writers: Iterable[RunWriter]) -> dict[str, Any]:
        """The whole funnel's accounting (every run), earlier segments included."""
        rx = self._receiver
        writers = list(writers)
        out: dict[str, Any] = {
            "_funnel/records": sum(w.records for w in writers),
            "_funnel/rows": sum(w.rows for w in writers),
            "_funnel/late_records": sum(w.late_records for w in writers),
            "_funnel/relogged_steps": sum(w.relogged_steps for w in writers),
            "_funnel/dropped_records": sum(w.dropped for w in writers) + rx.dropped,
            # after a restart, the ranks the dead loggers had too (ended ones do not come back)
            "_funnel/ranks": max(len(rx.streams.peers), len(self._journal.before.ranks)),
            "_funnel/dead_ranks": len(rx.dead_ranks),
            "_funnel/failed_ranks": len(self.failed),
            "_funnel/junk_frames": rx.junk_frames,
            "_funnel/rejected_peers": rx.rejected_peers + rx.auth_failures,
            "_funnel/media": sum(w.media.logged for w in writers),
            "_funnel/dropped_media": sum(w.media.dropped for w in writers),
            "_funnel/files": sum(w.media.files for w in writers),
            "_funnel/dropped_files": sum(w.media.dropped_files for w in writers),
            "_funnel/console_lines": sum(w.console.lines for w in writers),
            "_funnel/dropped_console_lines": sum(w.console.dropped for w in writers),
            "_funnel/replayed_records": rx.replayed,
            "_funnel/logger_restarts": self._journal.generation,
            **self._health.summary(),
        }
        for key, value in self._journal.earlier().items():
            out[key] = out.get(key, 0) + value
        # A fact about the installed wandb, not a count that earlier segments add to.
        lacks: set[str] = set()
        for w in writers:
            if isinstance(w.sink, Degradable):
                lacks.update(w.sink.degraded)
        out["_funnel/wandb_degraded"] = len(lacks)
        if rx.nodes.tiered:  # the node tier (issue 38): the job's nodes seen
            out["_funnel/nodes"] = rx.nodes.count()
        return out

    def shared(self, writers: Iterable[RunWriter], why: str) -> dict[str, Any]:
        """What every run's summary gets beside its own counts (``for_run``)."""
        out = {k: v for k, v in self.funnel(writers).items() if k not in PER_RUN}
        out["_funnel/exit_reason"] = why
        return out

    def for_run(
        self, writer: RunWriter, shared: dict[str, Any], dropped_elsewhere: int, main: bool
    ) -> dict[str, Any]:
        """One run's summary: ``shared`` and the run's own counts. ``dropped_elsewhere``:
        its records lost before the logger took them in; ``main``: the funnel's one run,
        which carries the earlier segments' counts."""
        earlier = self._journal.earlier() if main else {}
        summary = {
            **shared,
            "_funnel/records": writer.records,
            "_funnel/rows": writer.rows,
            "_funnel/late_records": writer.late_records,
            "_funnel/dropped_records": writer.dropped + dropped_elsewhere,
        }
        for key in PER_RUN:
            summary[key] += earlier.get(key, 0)
        return summary

    def cut_short(self, writers: Iterable[RunWriter], why: str) -> dict[str, Any]:
        """The accounting as it stands, from the watchdog's thread (counters only): records
        taken in but not yet handed to wandb are lost, and counted as dropped."""
        writers = list(writers)
        stats = self.funnel(writers)
        handled = sum(w.records + w.dropped for w in writers)
        stats["_funnel/dropped_records"] += max(0, self._receiver.streams.received() - handled)
        stats["_funnel/exit_reason"] = f"{why}; out of time inside wandb"
        return stats


def losses(stats: dict[str, Any]) -> str | None:
    """The one terminal line for what did not go as logged (None when nothing)."""
    lost = [f"{stats[key]} {key[len('_funnel/') :]}" for key in REPORTED if stats.get(key)]
    if not lost:
        return None
    return (
        f"what did not go as logged (the run's summary has it under _funnel/*): {', '.join(lost)}"
    )
