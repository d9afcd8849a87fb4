"""``capture_run()``: test your logging without wandb, as structlog's ``capture_logs`` does for
log lines.

    from wandb_funnel.testing import capture_run

    def test_my_training_logs_the_loss():
        with capture_run() as cap:
            train(steps=3)  # opens a wf.Funnel / wf.init, spawns workers that log
        assert [row["loss"] for row in cap.rows] == [...]
        assert cap.summary["_funnel/dropped_records"] == 0 and cap.exit_code == 0

Every funnel opened inside the block, in this process and in every process started from it
while it is open (``WANDB_FUNNEL_SINK`` is inherited), writes to a recording sink instead of
wandb: no wandb import, no wandb-core, no network, no run directory. The funnel itself runs
for real (logger process, sockets, ordering, reduction, accounting), so what ``cap`` holds is
what wandb would have been given. The recording lives in a private temporary directory,
removed when the block ends; ``cap`` keeps what was read from it.

Media values appear in rows as plain dicts shaped after what wandb writes for them: ``{"_type":
"image-file", "caption": ..., "width": ..., "height": ..., "format": ..., "size": ...,
"sha256": ...}``, ``{"_type": "histogram", "values": [...], "bins": [...]}``, ``{"_type":
"table", "columns": [...], "data": [...]}`` (the files themselves are not kept).
``log_artifact`` and ``save`` are in ``cap.files``: one dict per file, ``{"op": "save" or
"artifact", "name": its name in the run, "size": bytes}`` (and ``"artifact"``, ``"type"``
for an artifact's). ``cap.attributes`` holds what a rank set with ``run.name = ...``,
``run.notes = ...`` and ``run.tags = [...]`` (the last value of each).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from wandb_funnel._constants import ENV_SINK, SINK_RECORD_PREFIX

__all__ = ["CapturedRun", "RunCapture", "capture_run"]


class CapturedRun:
    """What one run was given, in the order the logger gave it."""

    def __init__(self, run_id: str, entries: list[dict[str, Any]]) -> None:
        self.id = run_id
        self.init: dict[str, Any] = {}
        self.rows: list[dict[str, Any]] = []
        self.config: dict[str, Any] = {}
        self.summary: dict[str, Any] = {}
        self.metrics: list[dict[str, Any]] = []
        self.console: list[tuple[str, str]] = []  # (stream, text), in write order
        self.stats: list[dict[str, Any]] = []
        self.files: list[dict[str, Any]] = []  # log_artifact's and save's files, in order
        self.tensorboard: list[dict[str, Any]] = []  # the log directories ranks synced
        self.exit_code: int | None = None  # None: the run was never finished
        # run.name / notes / tags as the ranks set them: the last value of each
        self.attributes: dict[str, Any] = {}
        for entry in entries:
            kind, data = entry["kind"], entry["data"]
            if kind == "init":  # wandb.init's arguments, config among them
                self.init = data
                self.config.update(data.get("config") or {})
            elif kind == "row":
                self.rows.append(data)
            elif kind == "config":
                self.config.update(data)
            elif kind == "summary":
                self.summary.update(data)
            elif kind == "metric":
                self.metrics.append(data)
            elif kind == "console":
                self.console.append((data["stream"], data["text"]))
            elif kind == "stats":
                self.stats.append(data)
            elif kind == "files":
                extra = {k: data[k] for k in ("artifact", "type") if k in data}
                for file in data["files"]:
                    self.files.append({"op": data["op"], **file, **extra})
            elif kind == "tensorboard":
                self.tensorboard.append(data)
            elif kind == "run":
                self.attributes.update(data)
            elif kind == "finish":
                self.exit_code = data["exit_code"]

    @classmethod
    def from_file(cls, path: str) -> CapturedRun:
        """Read one recording (``<run id>.jsonl``); a last line cut by a killed logger is
        left out."""
        return cls(*_recording(path))

    @property
    def console_text(self) -> str:
        """Everything the ranks printed, as one string (both streams, in write order)."""
        return "".join(text for _, text in self.console)

    def __repr__(self) -> str:
        return f"CapturedRun(id={self.id!r}, rows={len(self.rows)}, exit_code={self.exit_code})"


def _recording(path: str) -> tuple[str, list[dict[str, Any]]]:
    """A recording's run id and entries (whole lines only). A restarted logger's segment of
    the run is ``<run id>.<n>.jsonl``: its init entry names the run."""
    with open(path, encoding="utf-8") as f:
        entries = [json.loads(line) for line in f if line.endswith("\n")]
    init: Any = next((e["data"] for e in entries if e.get("kind") == "init"), {})
    run_id = init.get("id") if isinstance(init, dict) else None
    return str(run_id or os.path.basename(path).removesuffix(".jsonl")), entries


def _segment_index(name: str) -> tuple[str, int]:
    stem, _, index = name.removesuffix(".jsonl").rpartition(".")
    return (stem, int(index)) if stem and index.isdigit() else (name.removesuffix(".jsonl"), 0)


class RunCapture:
    """The runs recorded inside a ``capture_run()`` block (read when the block ends).

    ``rows``, ``config``, ``summary``, ``metrics``, ``console``, ``console_text``, ``stats``,
    ``files`` and ``exit_code`` are the only run's; with several (``run_mode="new"``), use ``runs``.
    """

    def __init__(self) -> None:
        self.runs: dict[str, CapturedRun] = {}

    @property
    def run(self) -> CapturedRun:
        if len(self.runs) != 1:
            raise LookupError(
                f"wandb_funnel.testing: {len(self.runs)} runs were recorded, not one: "
                f"use cap.runs[run_id] ({sorted(self.runs)})"
            )
        (only,) = self.runs.values()
        return only

    def __getattr__(self, name: str) -> Any:
        if name in (
            "rows",
            "config",
            "summary",
            "metrics",
            "console",
            "console_text",
            "stats",
            "files",
            "exit_code",
            "init",
            "id",
            "attributes",
        ):
            return getattr(self.run, name)
        raise AttributeError(name)

    def _read(self, directory: str) -> None:
        by_run: dict[str, list[dict[str, Any]]] = {}
        names = [n for n in os.listdir(directory) if n.endswith(".jsonl")]
        for name in sorted(names, key=_segment_index):  # a run's segments, in order
            run_id, entries = _recording(os.path.join(directory, name))
            by_run.setdefault(run_id, []).extend(entries)
        for run_id, entries in by_run.items():
            self.runs[run_id] = CapturedRun(run_id, entries)


@contextlib.contextmanager
def capture_run() -> Iterator[RunCapture]:
    """Record every run opened inside the block instead of writing it to wandb.

    Raises:
        RuntimeError: a capture is already active (or ``WANDB_FUNNEL_SINK`` is set).
    """
    if os.environ.get(ENV_SINK):
        raise RuntimeError(
            f"wandb_funnel.testing.capture_run: {ENV_SINK} is already set "
            f"({os.environ[ENV_SINK]!r}): captures do not nest"
        )
    directory = tempfile.mkdtemp(prefix="wandb-funnel-capture-")
    cap = RunCapture()
    os.environ[ENV_SINK] = f"{SINK_RECORD_PREFIX}{directory}"
    try:
        yield cap
    finally:
        os.environ.pop(ENV_SINK, None)
        try:
            cap._read(directory)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
