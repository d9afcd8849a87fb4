"""A sink that records the run as plain data: ``WANDB_FUNNEL_SINK=record:DIR``, set by
``wandb_funnel.testing.capture_run()``.

Every call the logger makes on its run is one JSON line in ``DIR/<run id>.jsonl``, flushed as
it is written, so the capturing process reads what the run got even when the logger was
killed. No wandb import, no wandb-core, no network. Media values are not made into wandb
objects here (that needs wandb): a row holds what the ranks sent for them, as
``{"_media": kind}`` placeholders (``MediaFiles`` counts them as logged).
"""

from __future__ import annotations

import json
import math
import os
from typing import IO, Any


def _plain(value: Any) -> Any:
    """JSON has no NaN or infinity: they are recorded as the strings Python prints."""
    if type(value) is float and not math.isfinite(value):
        return repr(value)
    if type(value) is dict:
        return {str(k): _plain(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return [_plain(v) for v in value]
    if value is None or type(value) in (bool, int, float, str):
        return value
    return {"_media": getattr(value, "desc", {}).get("k", type(value).__name__)}


class RecordingSink:
    """One run's calls as JSON lines; called from the logger's main thread only."""

    wandb = None  # media stay descriptors: there is no wandb here to make objects of them

    def __init__(self, directory: str, init_kwargs: dict[str, Any]) -> None:
        self.run_id: str = init_kwargs["id"]
        path = os.path.join(directory, f"{self.run_id}.jsonl")
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed at finish)
        self._write("init", {k: v for k, v in init_kwargs.items() if k != "settings"})

    def _write(self, kind: str, data: Any) -> None:
        self._file.write(json.dumps({"kind": kind, "data": _plain(data)}) + "\n")
        self._file.flush()

    def log(self, row: dict[str, Any]) -> None:
        self._write("row", row)

    def update_config(self, data: dict[str, Any]) -> None:
        self._write("config", data)

    def update_summary(self, data: dict[str, Any]) -> None:
        self._write("summary", data)

    def define_metric(self, data: dict[str, Any]) -> None:
        self._write("metric", data)

    def output(self, stream: str, text: str, timestamp: float) -> None:
        self._write("console", {"stream": stream, "text": text})

    def stats(self, data: dict[str, Any]) -> None:
        self._write("stats", data)

    def tensorboard(self, log_dir: str, save: bool, root_dir: str) -> None:
        self._write("tensorboard", {"log_dir": log_dir, "root_dir": root_dir})

    def info(self) -> dict[str, Any]:
        return {"id": self.run_id, "offline": True}

    def finish(self, exit_code: int) -> None:
        self._write("finish", {"exit_code": exit_code})
        self._file.close()
