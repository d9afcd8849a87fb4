"""A sink that writes nothing: ``WANDB_FUNNEL_SINK=null`` in the owner's environment.

For measuring the funnel alone (``benchmarks/``): workers, sockets, decoding, ordering and
merging all run as usual, and the accounting still counts every row; only wandb is left out,
so the figures show what the funnel can take in rather than what wandb can write.
"""

from __future__ import annotations

from typing import Any


class NullSink:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def log(self, row: dict[str, Any]) -> None:
        pass

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

    def info(self) -> dict[str, Any]:
        return {"id": self.run_id}

    def finish(self, exit_code: int) -> None:
        pass
