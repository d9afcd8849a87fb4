"""Where the logger's rows go: the Sink protocol. ``sinks.wandb`` is the real one."""

from __future__ import annotations

from typing import Any, Protocol


class Sink(Protocol):
    """One run's destination. Called from the logger's single thread only."""

    run_id: str

    def log(self, row: dict[str, Any]) -> None:
        """Write one history row (already merged, reduced and carrying the step key)."""

    def update_config(self, data: dict[str, Any]) -> None: ...

    def update_summary(self, data: dict[str, Any]) -> None: ...

    def output(self, stream: str, text: str, timestamp: float) -> None:
        """Console text (``stream`` is "stdout" or "stderr"), as wandb's capture records it."""

    def stats(self, data: dict[str, Any]) -> None:
        """A ``stats`` record (system metrics), keys already labelled."""

    def tensorboard(self, log_dir: str, save: bool, root_dir: str) -> None:
        """Watch a rank's tensorboard log directory (a ``tbrecord``, as wandb's
        ``sync_tensorboard`` writes one)."""

    def define_metric(self, data: dict[str, Any]) -> None:
        """``run.define_metric(**data)``, as a rank asked for it."""

    def info(self) -> dict[str, Any]:
        """What ``wandb.run`` tells about itself (name, project, dir, url, ...): plain data."""

    def finish(self, exit_code: int) -> None:
        """Finish the run; the caller bounds how long this may take."""
