"""A sink that records the run as plain data: ``WANDB_FUNNEL_SINK=record:DIR``, set by
``wandb_funnel.testing.capture_run()``.

Every call the logger makes on its run is one JSON line in ``DIR/<run id>.jsonl``, flushed as
it is written, so the capturing process reads what the run got even when the logger was
killed. No wandb import, no wandb-core, no network. A media value is recorded as a plain dict
shaped after what wandb writes for it (``{"_type": "image-file", "caption": ..., "width":
..., "height": ..., "format": ..., "size": ...}``, ``{"_type": "histogram", ...}``,
``{"_type": "table", "columns": ..., "data": ...}``), made from the descriptor the rank sent;
``log_artifact`` and ``save`` are recorded as their files' names and sizes.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import IO, TYPE_CHECKING, Any

from wandb_funnel.sinks.refs import BadMediaError, Walk, materialize

if TYPE_CHECKING:
    from wandb_funnel.sinks import Staging

# wandb's ``_type`` for each media class a descriptor names (what its run files say).
_TYPES = {
    "Image": "image-file",
    "Html": "html-file",
    "Video": "video-file",
    "Audio": "audio-file",
    "Object3D": "object3D-file",
    "Molecule": "molecule-file",
    "ImageMask": "mask",
    "BoundingBoxes2D": "boxes2D",
    "Classes": "classes",
}
_HEX64 = re.compile(r"[0-9a-f]{64}")
# A file-backed descriptor's state that the record keeps, and the name it keeps it under.
_STATE = {
    "_caption": "caption",
    "_width": "width",
    "_height": "height",
    "format": "format",
    "_format": "format",
    "_fps": "fps",
    "_duration": "duration",
    "_sample_rate": "sample_rate",
    "_size": "size",
    "_sha256": "sha256",
}


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
    return {"_type": type(value).__name__}  # nothing a rank sends: said, not lost


def describe(what: str, desc: dict[str, Any], walk: Walk) -> dict[str, Any]:
    """A media descriptor as the plain dict the recording keeps (a ``sinks.refs.Make``)."""
    if what == "histogram":
        return {"_type": "histogram", "values": list(desc["histogram"]), "bins": list(desc["bins"])}
    if what == "table":
        return {
            "_type": "table",
            "columns": list(desc["columns"]),
            "data": [[walk.cell(c) for c in row] for row in desc["data"]],
        }
    if what == "chart":
        spec = desc.get("spec") or {}
        return {
            "_type": "custom-chart",
            "spec": spec.get("spec_name"),
            "table": describe("table", desc["table"], walk),
        }
    if what == "file":
        name, state = desc.get("c"), desc.get("s")
        if type(name) is not str or name not in _TYPES or type(state) is not dict:
            raise BadMediaError(f"not a wandb media class: {name!r:.40}")
        out: dict[str, Any] = {"_type": _TYPES[name]}
        for attr, key in _STATE.items():
            if state.get(attr) is not None:
                out[key] = walk.convert(state[attr])
        for attr in ("_masks", "_boxes"):  # media of their own, counted as wandb's sink does
            if type(state.get(attr)) is dict:
                out[attr[1:]] = {str(k): walk.convert(v) for k, v in state[attr].items()}
        if "f" in desc:  # the staged file: missing or unnamed by its hash, dropped as wandb's
            walk.staging.path_of(desc["f"])
            if not (type(state.get("_sha256")) is str and _HEX64.fullmatch(state["_sha256"])):
                raise BadMediaError("a staged media file needs its sha256")
        if type(desc.get("ref")) is str:
            out["path"] = desc["ref"]
        return out
    raise BadMediaError(f"unknown media kind {what!r:.40}")


class RecordingSink:
    """One run's calls as JSON lines; called from the logger's main thread only."""

    stats_pid: int | None = None  # nothing samples a process here
    starting_step = 0

    def __init__(self, directory: str, init_kwargs: dict[str, Any], segment: int = 0) -> None:
        self.run_id: str = init_kwargs["id"]
        if not self.run_id or os.path.basename(self.run_id) != self.run_id:
            raise ValueError(f"a run id to record must be a plain name, got {self.run_id!r:.80}")
        # A restarted logger continues the run in a file of its own, as wandb starts a new
        # transaction log for a resumed run: ``<id>.jsonl``, then ``<id>.1.jsonl``, ...
        name = f"{self.run_id}.jsonl" if not segment else f"{self.run_id}.{segment}.jsonl"
        self.path = os.path.join(directory, name)
        self._file: IO[str] = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed at finish)
        self._rows = 0
        # The open row, as wandb keeps it until a later step commits it: [_step, data].
        self._open: list[Any] | None = None
        self._next_step = 0
        self._write("init", {k: v for k, v in init_kwargs.items() if k != "settings"})

    def saved_rows(self) -> int:
        return self._rows  # each line is flushed as it is written

    def segment(self) -> dict[str, Any]:
        return {"kind": "record", "path": self.path}

    def _write(self, kind: str, data: Any) -> None:
        self._file.write(json.dumps({"kind": kind, "data": _plain(data)}) + "\n")
        self._file.flush()

    def log(
        self, row: dict[str, Any], staging: Staging | None, step: int | None, commit: bool
    ) -> None:
        """The row as wandb's history would hold it: at ``_step``, merged into the open row
        at the same step, written once committed or once a later step opens a row."""
        if staging is not None:
            row, _ = materialize(row, staging, describe)
        open_row = self._open
        if open_row is not None and (step is None or step == open_row[0]):
            open_row[1].update(row)
        else:
            self._commit()
            at = self._next_step if step is None else step
            self._open = open_row = [at, dict(row)]
            self._next_step = at + 1
        if commit:
            self._commit()

    def _commit(self) -> None:
        if self._open is not None:
            step, data = self._open
            self._open = None
            self._write("row", {**data, "_step": step})
            self._rows += 1

    def files(self, data: dict[str, Any], staging: Staging) -> None:
        """Each file's name in the run and size (the staged copy is removed after this)."""
        entries = data.get("entries")
        files = [
            {"name": str(entry), "size": os.path.getsize(staging.path_of(name))}
            for entry, name in (entries if type(entries) is list else [])
        ]
        record: dict[str, Any] = {"op": data.get("op"), "files": files}
        if data.get("op") == "artifact":
            record.update(artifact=data.get("name"), type=data.get("type") or "unspecified")
            record["refs"] = [{"name": str(e), "ref": str(u)} for e, u in data.get("refs") or []]
        elif data.get("op") != "save":
            raise BadMediaError(f"unknown files operation {data.get('op')!r:.40}")
        self._write("files", record)

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

    def users_step_key(self) -> None:
        pass

    def without_footer(self) -> None:
        pass

    def info(self) -> dict[str, Any]:
        return {"id": self.run_id, "offline": True}

    def finish(self, exit_code: int) -> None:
        self._commit()
        self._write("finish", {"exit_code": exit_code})
        self._file.close()

    def update_run(self, data: dict[str, Any]) -> None:
        self._write("run", data)


def rows_in(path: str) -> list[dict[str, Any]]:
    """The rows a recording holds (whole lines only: its writer may have died mid-line)."""
    rows: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    break
                if isinstance(entry, dict) and entry.get("kind") == "row":
                    rows.append(entry.get("data") or {})
    except OSError:
        pass
    return rows
