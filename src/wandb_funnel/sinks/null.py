"""A sink that writes nothing: ``WANDB_FUNNEL_SINK=null`` in the owner's environment.

For measuring the funnel alone (``benchmarks/``): workers, sockets, decoding, ordering and
merging all run as usual, and the accounting still counts every row (media values as logged);
only wandb is left out, so the figures show what the funnel can take in rather than what
wandb can write. ``WANDB_FUNNEL_SINK=null:SECONDS``: each row takes that long (a sink slow on
purpose, so that a test of a long close does not depend on how loaded the machine is).
``WANDB_FUNNEL_NULL_ROWS=PATH``: each new row's wall time and step are appended to PATH, a
line each (``benchmarks/nodes.py`` measures from them how long a step took to become a row).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from wandb_funnel.sinks.refs import Absent, BadMediaError, Walk, materialize

if TYPE_CHECKING:
    from wandb_funnel.sinks import Staging


def _count(what: str, desc: dict[str, Any], walk: Walk) -> Any:
    walk.staging.logged += 1  # taken, as a run would take it, and left out
    raise Absent


class NullSink:
    stats_pid: int | None = None
    starting_step = 0

    def __init__(self, run_id: str, row_seconds: float = 0.0) -> None:
        self.run_id = run_id
        self._row_seconds = row_seconds
        self._rows = 0
        self._open: tuple[int | None] | None = None  # an open row's step, as wandb's
        path = os.environ.get("WANDB_FUNNEL_NULL_ROWS")
        self._times = open(path, "a", buffering=1) if path else None  # noqa: SIM115

    def saved_rows(self) -> int:
        return self._rows  # nothing to lose: "saved" as soon as counted

    def segment(self) -> dict[str, Any]:
        return {"kind": "null"}

    def log(
        self, row: dict[str, Any], staging: Staging | None, step: int | None, commit: bool
    ) -> None:
        open_row = self._open
        if open_row is None or (step is not None and step != open_row[0]):
            self._rows += 1  # a new history row (a merge into the open one is not)
            if self._times is not None:
                self._times.write(f"{time.time()} {step}\n")
            if self._row_seconds:
                time.sleep(self._row_seconds)
        self._open = None if commit else (step,)
        if staging is not None:
            materialize(row, staging, _count)

    def files(self, data: dict[str, Any], staging: Staging) -> None:
        raise BadMediaError("no wandb run here (the null sink)")

    def update_config(self, data: dict[str, Any]) -> None:
        pass

    def update_summary(self, data: dict[str, Any]) -> None:
        pass

    def define_metric(self, data: dict[str, Any]) -> None:
        pass

    def output(self, stream: str, text: str, timestamp: float) -> None:
        pass

    def stats(self, data: dict[str, Any]) -> None:
        pass

    def tensorboard(self, log_dir: str, save: bool, root_dir: str) -> None:
        pass

    def users_step_key(self) -> None:
        pass

    def without_footer(self) -> None:
        pass

    def info(self) -> dict[str, Any]:
        return {"id": self.run_id}

    def finish(self, exit_code: int) -> None:
        if self._times is not None:
            self._times.close()

    def update_run(self, data: dict[str, Any]) -> None:
        pass
