"""The runs a logger writes: one (``auto``, ``shared``), or one per rank (``new``), each a
``RunWriter`` with its own order, row builder, media and journal part, opened here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from wandb_funnel import _private_dir
from wandb_funnel._logger.journal import Journal
from wandb_funnel._logger.media import MediaFiles
from wandb_funnel._logger.ordering import Reorderer
from wandb_funnel._logger.reduce import RowBuilder
from wandb_funnel._logger.run_writer import RunWriter
from wandb_funnel._logger.say import log_to_stderr
from wandb_funnel._options import FunnelOptions
from wandb_funnel._protocol.messages import LoggerStart
from wandb_funnel.sinks import Opening, Sink


class SinkLostError(Exception):
    """This logger cannot go on (its wandb-core died): the owner starts a new one."""


class Runs:
    """The writers by rank (``None``: the funnel's one run)."""

    def __init__(
        self,
        start: LoggerStart,
        open_sink: Callable[..., Sink],
        journal: Journal,
        on_spread: Callable[[str, list[int], list[Any], int], None],
    ) -> None:
        self._options: FunnelOptions = start.options
        self._open_sink = open_sink
        self.journal = journal
        self._on_spread = on_spread
        self._dir = start.ipc_dir
        self.run_id = start.run_id
        self.per_rank = start.topology.per_rank  # run_mode="new": a run per rank
        self.writers: dict[int | None, RunWriter] = {}
        self.pids: dict[int, int] = {}  # rank -> its process (wandb-core samples it)

    def __iter__(self) -> Iterator[RunWriter]:
        return iter(list(self.writers.values()))

    @property
    def main(self) -> RunWriter | None:
        """The funnel's one run (None in run_mode="new", or before it is open)."""
        return self.writers.get(None)

    def _new(self, sink: Sink | None, name: str) -> RunWriter:
        options = self._options
        mode = "shared" if options.run_mode == "shared" else "auto"
        staging = os.path.join(self._dir, _private_dir.MEDIA) if self._dir else None
        warn = _warn_once(name)
        writer = RunWriter(
            sink,
            Reorderer(options.reorder_window, options.max_pending_rows),
            RowBuilder(mode, options.reduce, options.step_key, warn, self._on_spread),
            name,
            MediaFiles(staging, warn),
            options.step_key,
        )
        writer.journal = self.journal.for_run(main=name == self.run_id)
        if sink is not None:  # a resumed run's rows start past its last one
            writer.steps.next_step = sink.starting_step
        return writer

    def for_rank(self, rank: int) -> RunWriter:
        """The writer rank's records go to (in run_mode="new", its own run, opened now)."""
        if self.per_rank is None:
            return self.writers[None]
        writer = self.writers.get(rank)
        if writer is None:
            per = self.per_rank
            names = per.names(rank)
            run_id = per.id_template.format(**names)
            sink: Sink | None
            try:
                # wandb-core samples the rank's own process for its run, as plain wandb's
                # per-rank runs do (x_stats_pid).
                sink = self._open_sink(
                    {"id": run_id, "group": per.group_template.format(**names)},
                    self.pids.get(rank),
                )
            except Exception as exc:
                log_to_stderr(f"could not open run {run_id!r} for rank {rank}: {exc!r}")
                sink = None
            writer = self.writers[rank] = self._new(sink, run_id)
        return writer

    def open_main(self, opening: Opening, on_failure: Callable[[Exception], None]) -> RunWriter:
        """Open the one run. ``on_failure`` decides what a failure means (it raises to give
        up; when it returns, the run's records are counted as dropped)."""
        try:
            sink: Sink | None = self._open_sink({}, None, opening)
        except Exception as exc:
            on_failure(exc)
            sink = None
        writer = self.writers[None] = self._new(sink, self.run_id)
        return writer

    def info(self) -> dict[str, Any]:
        """What the run told about itself when it opened (empty in run_mode="new")."""
        writer = self.main
        if writer is None or writer.sink is None:
            return {}
        try:
            return writer.sink.info()
        except Exception as exc:
            log_to_stderr(f"could not read the run's name and directory: {exc!r}")
            return {}

    def pending_rows(self) -> int:
        return sum(w.order.pending_rows for w in self.writers.values())

    def sink_lost(self) -> bool:
        """wandb-core died under us (the one run's: a run per rank goes on without it)."""
        return self.per_rank is None and any(w.sink_lost for w in self.writers.values())


def _warn_once(name: str) -> Callable[[str], None]:
    """A writer's warnings, each said once (a reducer that cannot apply says so every row)."""
    said: set[str] = set()

    def warn(message: str) -> None:
        if message not in said and len(said) < 100:
            said.add(message)
            log_to_stderr(f"{name}: {message}")

    return warn
