"""Reads back what wandb really wrote: the ``.wandb`` files of offline runs.

Uses ``wandb leet inspect --json`` (shipped inside the wandb wheel), so the soak harness and
the tests check wandb's own view of the file rather than anything we think we sent.

A job run with the recording sink (``WANDB_FUNNEL_SINK=record:$WANDB_DIR/funnel-recording``,
see ``recording_env``) leaves JSON lines instead of ``.wandb`` files: ``find_runs`` reads those
too, into the same ``WandbRun`` (history, config, summary, metrics, exit code, console,
stats). What only wandb writes (environment, telemetry, files, artifacts, wandb-core's own
stats) is absent there: a check of that runs on wandb.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from wandb_funnel._constants import TRUE_STEP_KEY


@dataclass
class WandbRun:
    path: pathlib.Path
    run_id: str = ""
    name: str = ""  # the display name
    project: str = ""
    group: str = ""
    notes: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)  # the artifact records
    files: list[str] = field(default_factory=list)  # paths the files records name
    record_types: dict[str, int] = field(default_factory=dict)  # how many of each kind
    output_raw: list[dict[str, Any]] = field(default_factory=list)  # console records
    environment: dict[str, Any] = field(default_factory=dict)  # program, args, host, ...
    stats: list[dict[str, Any]] = field(default_factory=list)  # system metrics samples
    tbrecords: list[dict[str, Any]] = field(default_factory=list)  # tensorboard log dirs
    telemetry: dict[str, Any] = field(default_factory=dict)  # the last telemetry (cumulative)
    start_time: float | None = None  # the run record's start, seconds since the epoch
    runtime: int | None = None  # the exit record's (None: absent, as protobuf leaves out 0)
    # Files one run was written in: more than one when a restarted logger continued it
    # (a resumed run: wandb writes a new transaction log, a segment, each time).
    segments: list[pathlib.Path] = field(default_factory=list)

    def count_cells(self, pattern: str) -> int:
        """How many history cells have a key matching ``pattern`` (a full-match regex)."""
        regex = re.compile(pattern)
        return sum(1 for row in self.history for key in row if regex.fullmatch(key))

    def column(self, key: str, step_key: str | None = None) -> list[tuple[int, Any]]:
        """(step, value) for every history row that has ``key``, in file order; the step is
        the row's own (``step_of``: its ``_step``, or a late row's kept step), or its
        ``step_key`` when one is named (a user's own step key)."""
        return [
            (row[step_key] if step_key is not None else step_of(row), row[key])
            for row in self.history
            if key in row
        ]


def step_of(row: dict[str, Any]) -> Any:
    """A funnel row's own step: its ``_step``, or, for a late row (written at the next free
    step: wandb takes no step below its current one), the step it keeps under
    ``TRUE_STEP_KEY``."""
    return row[TRUE_STEP_KEY] if TRUE_STEP_KEY in row else row["_step"]


def _wandb_cli() -> list[str]:
    exe = pathlib.Path(sys.executable).with_name("wandb")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("wandb")
    if found:
        return [found]
    return [sys.executable, "-m", "wandb"]


@functools.cache
def _has_leet() -> bool:
    """Whether the installed wandb's CLI has ``leet inspect --json`` (0.31 and later: 0.29
    and 0.30 have ``leet inspect`` without it, older ones no ``leet`` at all)."""
    done = subprocess.run(
        [*_wandb_cli(), "leet", "inspect", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode == 0 and "--json" in done.stdout


def inspect_records(path: os.PathLike[str] | str) -> Iterator[dict[str, Any]]:
    """Every record of one ``run-*.wandb`` file as ``wandb leet inspect --json`` gives it:
    with wandb's own reader where the installed wandb has one, else decoded here with
    wandb's own protobuf classes into the same shape (``_as_leet``)."""
    if not _has_leet():
        yield from _records_by_protobuf(path)
        return
    out = subprocess.run(
        [*_wandb_cli(), "leet", "inspect", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    # not splitlines(): JSON leaves U+0085 and U+2028 raw
    records = [json.loads(line) for line in out.split("\n") if line.strip()]
    if os.environ.get(CHECK_READER_VAR):
        _same_as_leet(path, records)
    yield from records


# Set (by the tests' conftest, where leet is there): every file read is decoded both ways,
# and a difference fails the read: the fallback stays what leet says on the wandb that has it.
CHECK_READER_VAR = "WANDB_FUNNEL_CHECK_READER"


def _same_as_leet(path: os.PathLike[str] | str, records: list[dict[str, Any]]) -> None:
    ours = list(_records_by_protobuf(path))
    for theirs, mine in zip(records, ours, strict=False):
        if {**theirs, "num": 0} != {**mine, "num": 0}:
            raise AssertionError(f"{path}: leet read {theirs!r}, the fallback {mine!r}")
    if len(records) != len(ours):
        raise AssertionError(f"{path}: leet read {len(records)} records, the fallback {len(ours)}")


def _records_by_protobuf(path: os.PathLike[str] | str) -> Iterator[dict[str, Any]]:
    from wandb_funnel.sinks.wandb.txlog import records_as_dicts

    for num, (kind, raw) in enumerate(records_as_dicts(str(path)), 1):
        body = _as_leet(raw)
        # Where leet writes a field protobuf's JSON leaves out (its value the default) or
        # writes otherwise (an int64 as a number).
        if kind == "history":
            body["step"] = {"num": int(body.get("step", {}).get("num", 0))}
        elif kind == "exit":
            body.setdefault("exit_code", 0)
        elif kind == "output_raw":
            body.setdefault("output_type", "STDERR")  # the enum's 0
        yield {"num": num, "type": kind, kind: body}


def _as_leet(value: Any) -> Any:
    """protobuf's JSON as leet gives it: a list of items (``key`` or ``nested_key``, and
    ``value_json``) as one dict of their decoded values, keyed by the dotted key."""
    if isinstance(value, dict):
        return {k: _as_leet(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, dict) and "value_json" in v for v in value):
            items = {
                v.get("key") or ".".join(v.get("nested_key", [])): json.loads(v["value_json"])
                for v in value
            }
            return dict(sorted(items.items()))  # leet's order
        return [_as_leet(v) for v in value]
    return value


def read_run(path: os.PathLike[str] | str) -> WandbRun:
    """Parse one ``run-*.wandb`` file."""
    run = WandbRun(pathlib.Path(path))
    for rec in inspect_records(path):
        kind = str(rec.get("type"))
        run.record_types[kind] = run.record_types.get(kind, 0) + 1
        if kind == "run":
            body = rec["run"]
            run.run_id = body.get("run_id", "")
            run.group = body.get("run_group", "")
            run.name = body.get("display_name", "")  # each run record says the run whole
            run.project = body.get("project", run.project)
            run.notes = body.get("notes", "")
            run.tags = list(body.get("tags", []))
            run.telemetry = body.get("telemetry", run.telemetry)
            if body.get("start_time"):
                run.start_time = _epoch(body["start_time"])
            for key, value in body.get("config", {}).get("update", {}).items():
                run.config[key] = value
        elif kind == "history":
            run.history.append(rec["history"]["item"])
        elif kind == "summary":
            run.summary.update(rec["summary"].get("update", {}))
        elif kind == "config":
            run.config.update(rec["config"].get("update", {}))
        elif kind == "metric":
            run.metrics.append(rec["metric"])
        elif kind == "stats":
            run.stats.append(rec["stats"].get("item", {}))
        elif kind == "output_raw":
            run.output_raw.append(rec["output_raw"])
        elif kind == "environment":
            run.environment.update(rec["environment"])
        elif kind == "tbrecord":
            run.tbrecords.append(rec["tbrecord"])
        elif kind == "artifact":
            run.artifacts.append(rec["artifact"])
        elif kind == "files":
            run.files.extend(f.get("path", "") for f in rec["files"].get("files", []))
        elif kind == "telemetry":
            run.telemetry = rec["telemetry"]
        elif kind == "exit":
            run.exit_code = int(rec["exit"].get("exit_code", 0))
            run.runtime = rec["exit"].get("runtime")
    if not run.run_id:  # a logger killed before wandb flushed the run record: its file says
        run.run_id = run.path.stem.removeprefix("run-")
    return run


def _epoch(stamp: str) -> float:
    """An RFC 3339 time as wandb writes it (``2026-11-27T05:52:17.785213Z``, nanoseconds at
    most) in seconds since the epoch."""
    from datetime import datetime

    head, _, frac = stamp.rstrip("Z").partition(".")
    whole = datetime.fromisoformat(head + "+00:00").timestamp()
    return whole + (float("0." + frac) if frac else 0.0)


RECORDING_DIR = "funnel-recording"  # under $WANDB_DIR, for jobs run on the recording sink


def recording_env(wandb_dir: os.PathLike[str] | str) -> dict[str, str]:
    """The environment that puts a job's runs on the recording sink, where ``find_runs`` reads
    them: no wandb-core, no ``.wandb`` file, no ``leet inspect``."""
    from wandb_funnel._constants import ENV_SINK, SINK_RECORD_PREFIX

    directory = pathlib.Path(wandb_dir) / RECORDING_DIR
    directory.mkdir(parents=True, exist_ok=True)
    return {ENV_SINK: f"{SINK_RECORD_PREFIX}{directory}"}


def read_recording(path: os.PathLike[str] | str) -> WandbRun:
    """One recording (``<run id>.jsonl``, the recording sink's, read as ``capture_run`` reads
    it) as a ``WandbRun``."""
    from wandb_funnel.testing import CapturedRun

    rec = CapturedRun.from_file(str(path))
    return WandbRun(
        pathlib.Path(path),
        run_id=rec.id,
        name=rec.attributes.get("name", rec.init.get("name")) or "",
        group=rec.init.get("group") or "",
        notes=rec.attributes.get("notes", rec.init.get("notes")) or "",
        tags=list(rec.attributes.get("tags", rec.init.get("tags")) or []),
        config=rec.config,
        history=rec.rows,
        summary=rec.summary,
        exit_code=rec.exit_code,
        metrics=rec.metrics,
        artifacts=[f for f in rec.files if f["op"] == "artifact"],
        files=[f["name"] for f in rec.files],
        output_raw=[
            {"line": text, "output_type": "STDERR" if stream == "stderr" else "STDOUT"}
            for stream, text in rec.console
        ],
        stats=rec.stats,
        tbrecords=rec.tensorboard,
    )


def find_runs(wandb_dir: os.PathLike[str] | str) -> list[WandbRun]:
    """Every offline run under ``$WANDB_DIR/wandb`` (the ``latest-run`` link skipped), and
    every recording under ``$WANDB_DIR/funnel-recording``."""
    root = pathlib.Path(wandb_dir)
    files = sorted((root / "wandb").glob("offline-run-*/run-*.wandb"), key=_segment_order)
    recordings = sorted((root / RECORDING_DIR).glob("*.jsonl"), key=_segment_order)
    return merge_segments([read_run(f) for f in files] + [read_recording(f) for f in recordings])


def _segment_order(path: pathlib.Path) -> tuple[str, int]:
    """Segments of one run in the order they were written: wandb names a resumed run's
    directory ``offline-run-<time>-<id>-1``, ``-2``, ...; the recording sink ``<id>.1.jsonl``."""
    if path.suffix == ".jsonl":
        stem, _, index = path.name[: -len(".jsonl")].rpartition(".")
        return (stem, int(index)) if stem and index.isdigit() else (path.name[: -len(".jsonl")], 0)
    head, _, index = path.parent.name.rpartition("-")
    if index.isdigit() and head.count("-") >= 3:  # offline-run-<date>_<time>-<id>-<n>
        return head, int(index)
    return path.parent.name, 0


def merge_segments(runs: list[WandbRun]) -> list[WandbRun]:
    """One ``WandbRun`` per run id: the segments of a run a restarted logger continued, in
    the order given, read as wandb sync uploads them (history in order, later summary and
    config values winning, the last segment's exit record)."""
    merged: dict[str, WandbRun] = {}
    out: list[WandbRun] = []
    for run in runs:
        first = merged.get(run.run_id) if run.run_id else None
        if first is None:
            run.segments = [run.path]
            merged[run.run_id] = run
            out.append(run)
            continue
        first.segments.append(run.path)
        first.name, first.notes, first.tags = run.name, run.notes, run.tags  # the last said
        first.history.extend(run.history)
        first.summary.update(run.summary)
        first.config.update(run.config)
        first.metrics.extend(run.metrics)
        first.artifacts.extend(run.artifacts)
        first.files.extend(run.files)
        first.output_raw.extend(run.output_raw)
        first.stats.extend(run.stats)
        first.tbrecords.extend(run.tbrecords)
        for kind, count in run.record_types.items():
            first.record_types[kind] = first.record_types.get(kind, 0) + count
        first.exit_code, first.runtime = run.exit_code, run.runtime
    return out


def only_run(wandb_dir: os.PathLike[str] | str) -> WandbRun:
    runs = find_runs(wandb_dir)
    assert len(runs) == 1, f"expected exactly one run under {wandb_dir}, found {len(runs)}"
    return runs[0]
