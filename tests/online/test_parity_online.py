"""Parity online (issue 25, item 5): the same multi-rank job, run once with plain wandb and once
under ``wandb-funnel run --`` (no line of the funnel's in it), online against OpenWandb behind
the fault proxy; both runs are read back from the SERVER and compared where a user looks: the
history rows, the summary, the config, the run's name, tags and notes, and the files.

- ``test_a_rank0_script_online_is_plain_wandbs_run_on_the_server``: a DDP script under
  torchrun where only rank 0 calls wandb (``tests/programs/rank0_online.py``: ``init``,
  ``config.update``, ``define_metric``, ``log`` with ``commit=False``, 0-d tensors, an image
  and a histogram, ``summary``, ``save``, ``finish``); its ``log`` calls without ``step=``
  (nanoGPT, HF) and with ``step=`` (accelerate).
- ``test_hf_trainer_online_through_the_funnel_is_plain_wandbs_run``: HF ``Trainer`` with
  ``report_to=["wandb"]`` under torchrun (``tests/programs/client_hf.py``: a tiny BERT built
  from a config, nothing downloaded), which logs from rank 0 only.

Each job runs in a project of its own, so "one run, not one per rank" is the project's run
list. What the funnel adds or changes by design is asserted as such; what is left out of a
comparison is said where it is left out.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import PROGRAMS, Scripts, leftover_processes, reports
from tests.online.conftest import Online
from tests.online.openwandb import ServerRun

pytestmark = [pytest.mark.online, pytest.mark.processes]

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
FUNNEL_RUN = [sys.executable, "-m", "wandb_funnel", "run", "--"]
JOB_TIMEOUT = 240.0

# Keys of every history row whose values are clocks: ``_timestamp``, the wall time of the
# ``run.log`` call that handed the row to wandb (wandb's SDK stamps it unless the row has
# one), and ``_runtime``, wandb-core's clock since the run's wandb.init reached it. Through
# the funnel that call and that init are the logger's: a row's ``_timestamp`` is when the
# logger wrote it, not when the rank logged it (rows logged while the run opens in the
# background, 2-5 s online, or while the logger waits once for ranks that never call wandb,
# reorder_window, share the time the logger caught up), and ``_runtime`` starts at the
# logger's wandb.init (docs/guide/known-limits.md). Neither can be equal across two runs; they
# are checked for presence and order only.
CLOCKS = ("_timestamp", "_runtime")
# The funnel's own key in every row (its x-axis: the ranks' step) and in the summary, and its
# accounting in the summary: by design, asserted separately.
STEP_KEY = "global_step"
FUNNEL_PREFIX = "_funnel/"
# The files OpenWandb holds for any run of these jobs (besides media and saved files).
RUN_FILES = {
    "config.yaml",
    "output.log",
    "requirements.txt",
    "wandb-history.jsonl",
    "wandb-metadata.json",
    "wandb-summary.json",
}
# wandb-metadata.json keys that differ between any two runs (when, where, which writer).
VOLATILE_METADATA = {"startedAt", "writerId", "root", "disk", "memory", "args"}
# What wandb-core's hardware probe adds, in the background and on a best-effort basis
# (wandb#9043: "collected on a best-effort basis and takes some time"): a run whose wandb-core
# lives 2 s, as the HF job's does, may end before it lands, plain wandb's run as the funnel's
# (CI saw the funnel's HF run without it, wandb-core's whole life 2.01 s, plain's 1.95 s
# with it). Compared where both runs have it.
HARDWARE_METADATA = {"cpu", "cpu_count", "cpu_count_logical", "gpu", "gpu_count", "gpu_type"}
HARDWARE_METADATA |= {"gpu_nvidia", "gpu_amd", "gpu_apple", "cuda", "tpu", "trainium"}
# An output.log line the filestream appended (wandb-core's timestamp, then the line).
STAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+ (.*)$")


@dataclass
class Job:
    """One job's result, and its run as the server holds it."""

    variant: str
    proc: subprocess.CompletedProcess[str]
    elapsed: float
    run: ServerRun
    record: dict[str, Any]  # the server's runs row: tags, notes, program, host
    completed: bool  # the proxy saw the filestream's complete request

    @property
    def metrics(self) -> dict[str, dict[str, Any]]:
        return metric_records(self.run)


def _record(online: Online, run_id: str) -> dict[str, Any]:
    """The server's own row for the run (what ServerRun does not carry), read-only."""
    conn = sqlite3.connect(f"file:{online.server.db_path}?mode=ro", uri=True, timeout=10)
    try:
        conn.row_factory = sqlite3.Row
        row = conn.execute(
            "SELECT tags_json, notes, program, host FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()
    finally:
        conn.close()
    assert row is not None, run_id
    return {
        "tags": json.loads(row["tags_json"] or "[]"),
        "notes": row["notes"],
        "program": row["program"],
        "host": row["host"],
    }


def run_job(
    online: Online, scripts: Scripts, variant: str, argv: list[str], expected_rows: int
) -> Job:
    """Run ``argv`` (with the funnel in front for ``variant == "funnel"``) in a project of
    its own, and read its one run back from the server once the filestream said complete."""
    own = Online(online.server, online.proxy, f"{online.project}-{variant}")
    command = [*FUNNEL_RUN, *argv] if variant == "funnel" else argv
    t0 = time.monotonic()
    proc = scripts.run_command(command, own.env, timeout=JOB_TIMEOUT)
    elapsed = time.monotonic() - t0
    tail = f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0, tail
    assert leftover_processes(scripts.mark) == []
    ids = own.run_ids()
    assert len(ids) == 1, f"{variant}: one run, not one per rank: {ids}\n{tail}"
    (run_id,) = ids
    run = own.run(run_id)
    print(f"{variant}: {elapsed:.1f} s, run {run_id}")  # the report's run times (-s)
    assert run.state == "finished" and run.exit_code == 0, (run.state, run.exit_code)
    assert online.proxy.history_lines()[run_id] == expected_rows  # each row sent once
    assert "wandb-funnel" not in proc.stderr, tail  # nothing lost or refused to report
    return Job(
        variant=variant,
        proc=proc,
        elapsed=elapsed,
        run=run,
        record=_record(online, run_id),
        completed=run_id in online.proxy.completed_runs(),
    )


# ---- what a user sees ---------------------------------------------------------------------
def users(data: dict[str, Any]) -> dict[str, Any]:
    """A row or summary without wandb's clocks and bookkeeping (``_runtime``,
    ``_timestamp``, ``_wandb``) and the funnel's additions (``global_step``, ``_funnel/*``);
    ``_step`` is kept: it is equal wherever the script logs without ``step=``."""
    return {
        k: v
        for k, v in data.items()
        if k not in (*CLOCKS, "_wandb", STEP_KEY) and not k.startswith(FUNNEL_PREFIX)
    }


def funnels(data: dict[str, Any]) -> set[str]:
    return {k for k in data if k == STEP_KEY or k.startswith(FUNNEL_PREFIX)}


def metric_records(run: ServerRun) -> dict[str, dict[str, Any]]:
    """The run's define_metric records (config ``_wandb.m``), by name or glob, with the step
    metric's index resolved to its name (``"5"``: 1-based into the list)."""
    raw = run.config_raw["_wandb"]["value"].get("m", [])
    out: dict[str, dict[str, Any]] = {}
    for record in raw:
        named = dict(record)
        index = named.pop("5", None)
        if index is not None:
            named["step_metric"] = raw[int(index) - 1].get("1")
        out[str(record.get("1") or record.get("2"))] = named
    return out


def assert_clocks_in_order(run: ServerRun) -> None:
    for key in CLOCKS:
        values = [row[key] for row in run.history]
        assert values == sorted(values), (key, values)


def uploaded_output(run: ServerRun) -> list[str]:
    """output.log as wandb uploaded it at finish (OpenWandb stores the upload and appends
    the filestream's stamped lines, before or after it: ``openwandb.py``), checked against
    those stamped lines: each of them is a line of the upload."""
    text = run.output_log
    assert text is not None
    plain_lines, stamped = [], []
    for line in text.splitlines():
        match = STAMPED.match(line)
        if match:
            stamped.append(match.group(1))
        elif line:
            plain_lines.append(line)
    assert set(stamped) <= set(plain_lines), set(stamped) - set(plain_lines)
    return plain_lines


def metadata(run: ServerRun) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(run.read("wandb-metadata.json"))
    return data


def assert_the_same_run_record(plain: Job, funnel: Job) -> None:
    """Name, tags, notes, program and host: the server's own row of each run."""
    assert plain.run.display_name == funnel.run.display_name
    assert plain.record == funnel.record
    assert plain.completed and funnel.completed


def assert_the_same_metadata(plain: Job, funnel: Job, args: list[str]) -> None:
    """wandb-metadata.json: the user's program and its arguments (the logger's wandb.init
    records the rank's, not its own), the interpreter and the host; minus what differs
    between any two runs (``VOLATILE_METADATA``: times, paths, disk use; ``args`` checked
    here against what was passed), and the hardware a run ended before wandb-core had
    probed (``HARDWARE_METADATA``)."""
    mine, theirs = metadata(plain.run), metadata(funnel.run)
    assert mine["args"] == theirs["args"] == args
    probed = HARDWARE_METADATA - (mine.keys() & theirs.keys())  # one run ended first
    stable = {k: v for k, v in mine.items() if k not in VOLATILE_METADATA | probed}
    assert stable == {k: v for k, v in theirs.items() if k not in VOLATILE_METADATA | probed}
    assert stable["program"].endswith(".py") and "wandb_funnel" not in stable["program"]


# ---- 1. a rank-0-only DDP script -----------------------------------------------------------
RANK0 = str(PROGRAMS / "rank0_online.py")
STEPS = 12
EVAL_STEPS = [3, 7, 11]  # rank0_online.py: val/loss every 4th step, merged with commit=False
# A media file is named after the row's _step: media/images/<key>_<_step>_<sha20>.png
MEDIA_STEP = re.compile(r"^(media/.+)_\d+_([0-9a-f]{20}\.\w+)$")


def unstepped(path: str) -> str:
    return MEDIA_STEP.sub(r"\1_<step>_\2", path)


def view(data: dict[str, Any]) -> dict[str, Any]:
    """``users(data)`` without ``_step``, media paths without their step (both compared on
    their own: they differ by design when the script passes ``step=``)."""
    out = {}
    for key, value in users(data).items():
        if key == "_step":
            continue
        media = isinstance(value, dict) and isinstance(value.get("path"), str)
        out[key] = {**value, "path": unstepped(value["path"])} if media else value
    return out


@pytest.mark.timeout(2 * JOB_TIMEOUT + 60)
@pytest.mark.parametrize("stride", [0, 10], ids=["no-step", "step-arg"])
def test_a_rank0_script_online_is_plain_wandbs_run_on_the_server(
    online: Online, scripts: Scripts, tmp_path_factory: pytest.TempPathFactory, stride: int
) -> None:
    """``stride`` 0: every ``log`` without ``step=`` (nanoGPT, HF); 10: ``log(..., step=10 *
    step)`` (accelerate's tracker passes its step)."""
    args = ["--steps", str(STEPS), "--stride", str(stride)]
    argv = [*TORCHRUN, RANK0, *args]
    plain = run_job(online, Scripts(tmp_path_factory.mktemp("plain")), "plain", argv, STEPS)
    funnel = run_job(online, scripts, "funnel", argv, STEPS)
    for job in (plain, funnel):  # the id rank 0 reported is the run the server holds
        assert reports(job.proc.stdout)["run_id"] == job.run.run_id

    assert_the_same_run_record(plain, funnel)
    assert plain.run.display_name == "parity-online"
    assert plain.record["tags"] == ["ddp", "rank0"]
    assert plain.record["program"].endswith("rank0_online.py")
    assert_the_same_metadata(plain, funnel, args)

    # History: every row, in order, with every user key and value (the image's and the
    # histogram's descriptors included).
    p_rows, f_rows = plain.run.history, funnel.run.history
    assert [view(r) for r in f_rows] == [view(r) for r in p_rows]
    assert [s for s, r in enumerate(p_rows) if "val/loss" in r] == EVAL_STEPS
    last = p_rows[-1]
    assert last["samples"]["_type"] == "image-file" and last["weights"]["_type"] == "histogram"
    # The step: the user's (the step= passed, or wandb's count) is _step in both runs (issue
    # 34: the funnel's _step counted rows, the user's step under its global_step key).
    users_steps = [stride * s for s in range(STEPS)] if stride else list(range(STEPS))
    assert plain.run.steps == funnel.run.steps == users_steps
    assert not any(STEP_KEY in r for r in p_rows + f_rows)
    f_last = f_rows[-1]
    assert last["samples"]["path"].startswith("media/images/samples_")
    assert f_last["samples"]["path"].startswith("media/images/samples_")
    for job in (plain, funnel):
        assert_clocks_in_order(job.run)
    # The chart's x-axis: the user's define_metric("val/loss", summary="min") in both, and
    # nothing of the funnel's (it declared "*" -> global_step before issue 34).
    p_metrics, f_metrics = plain.metrics, funnel.metrics
    assert p_metrics == f_metrics
    assert set(p_metrics) == {"val/loss"}

    # Summary, as the filestream left it (scalars only) and as uploaded (wandb-summary.json:
    # media, the histogram and val/loss's {"min": ...} too): the user's keys and values.
    assert users(funnel.run.summary) == users(plain.run.summary)
    assert plain.run.summary["best_val"] == min(r["val/loss"] for r in p_rows if "val/loss" in r)
    p_file, f_file = plain.run.summary_file, funnel.run.summary_file
    assert p_file is not None and f_file is not None
    assert view(f_file) == view(p_file)
    assert p_file["_step"] == f_file["_step"] == users_steps[-1]
    assert p_file["val/loss"] == {"min": plain.run.summary["best_val"]}
    assert (p_file["samples"], f_file["samples"]) == (last["samples"], f_last["samples"])
    # By design: the funnel's accounting and step key; only rank 0 ever attached (rank 1
    # never calls wandb), every record written, none dropped or late.
    assert funnels(plain.run.summary) == set()
    # (in the uploaded summary: the server's summary table holds no key that starts with "_")
    extra = f_file
    assert STEP_KEY not in extra
    assert extra["_funnel/ranks"] == 1 and extra["_funnel/rows"] == STEPS
    assert extra["_funnel/records"] == STEPS + len(EVAL_STEPS)  # the commit=False logs
    assert extra["_funnel/dropped_records"] == extra["_funnel/late_records"] == 0
    assert extra["_funnel/files"] == 1 and extra["_funnel/dropped_files"] == 0  # wandb.save

    # Config: the user's keys and values (int keys of id2label as wandb stores them: str).
    expected_config = {
        "lr": 0.05,
        "optimizer": {"name": "sgd", "momentum": 0.9},
        "layers": [8, 2],
        "id2label": {"0": "neg", "1": "pos"},
        "world_size": 2,
        "steps": STEPS,
    }
    assert funnel.run.config == plain.run.config == expected_config

    # Files: the same names (the image's step aside: above); the same bytes where a file is
    # deterministic (the image, the saved file, requirements.txt). Not compared by size:
    # config.yaml (_wandb's metrics differ, above; its metadata's paths and times),
    # wandb-summary.json (the funnel's keys), wandb-history.jsonl (global_step, clocks),
    # wandb-metadata.json (above), output.log (below).
    image, f_image = last["samples"]["path"], f_last["samples"]["path"]
    assert set(plain.run.files) == {*RUN_FILES, "notes.json", image}
    assert set(funnel.run.files) == {*RUN_FILES, "notes.json", f_image}
    assert plain.run.files[image] == last["samples"]["size"]
    assert funnel.run.read(f_image) == plain.run.read(image)
    for name in ("notes.json", "requirements.txt"):
        assert funnel.run.read(name) == plain.run.read(name), name
    assert json.loads(plain.run.read("notes.json")) == {"steps": STEPS, "world": 2}

    # Logs: rank 0's console, as plain wandb captured it (its REPORT line names its own run);
    # not rank 1's (it never called wandb), and nothing printed after finish.
    def logs(job: Job) -> list[str]:
        return [line.replace(job.run.run_id, "RUN") for line in uploaded_output(job.run)]

    assert logs(funnel) == logs(plain)
    assert logs(plain)[1:3] == [
        f"training {STEPS} steps on 2 ranks",
        f"step 0 loss {p_rows[0]['train/loss']:.4f}",
    ]
    assert not any("done" in line for line in logs(plain))


# ---- 2. HF Trainer under torchrun ----------------------------------------------------------
HF = str(PROGRAMS / "client_hf.py")
HF_ROWS = 9  # logging_steps=2 and eval_steps=6 over max_steps=12, then the end-of-train row
HF_STEPS = [2, 4, 6, 6, 8, 10, 12, 12, 12]  # train/global_step of each row
HF_LOSS_STEPS = [2, 4, 6, 8, 10, 12]
HF_EVAL_STEPS = [6, 12]


def _timed(key: str) -> bool:
    """A value measured in seconds (or per second): different in any two runs."""
    return "runtime" in key or "per_second" in key


def _deterministic(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in users(data).items() if not _timed(k)}


@pytest.mark.frameworks
@pytest.mark.timeout(2 * JOB_TIMEOUT + 60)
def test_hf_trainer_online_through_the_funnel_is_plain_wandbs_run(
    online: Online, scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # output_dir relative to each job's directory: the Trainer's args (the config) are equal
    argv = [*TORCHRUN, HF, "out"]
    plain = run_job(online, Scripts(tmp_path_factory.mktemp("plain-hf")), "plain", argv, HF_ROWS)
    funnel = run_job(online, scripts, "funnel", argv, HF_ROWS)

    assert_the_same_run_record(plain, funnel)
    assert plain.run.display_name == "hf-run"
    assert plain.record["program"].endswith("client_hf.py")
    assert_the_same_metadata(plain, funnel, ["out"])

    # History: the Trainer's rows (train/loss at each logging step, eval/* at each eval
    # step, the end-of-train row), every key in both; every value but the timed ones
    # (eval/runtime, eval/*_per_second) equal.
    p_rows, f_rows = plain.run.history, funnel.run.history
    assert [r["train/global_step"] for r in p_rows] == HF_STEPS
    assert [r["train/global_step"] for r in p_rows if "train/loss" in r] == HF_LOSS_STEPS
    assert [r["train/global_step"] for r in p_rows if "eval/loss" in r] == HF_EVAL_STEPS
    assert [set(users(r)) for r in f_rows] == [set(users(r)) for r in p_rows]
    assert [_deterministic(r) for r in f_rows] == [_deterministic(r) for r in p_rows]
    assert plain.run.steps == funnel.run.steps == list(range(HF_ROWS))
    assert not any(STEP_KEY in r for r in f_rows)  # nothing of the funnel's in the rows
    for job in (plain, funnel):
        assert_clocks_in_order(job.run)
    # The step axis: HF's define_metric("*", step_metric="train/global_step"), and nothing
    # of the funnel's beside it.
    p_metrics, f_metrics = plain.metrics, funnel.metrics
    assert p_metrics["*"]["step_metric"] == f_metrics["*"]["step_metric"] == "train/global_step"
    assert set(f_metrics) == set(p_metrics)

    # Config: the Trainer's arguments and the model's config, every key and value.
    assert funnel.run.config == plain.run.config
    config = plain.run.config
    assert (config["max_steps"], config["logging_steps"], config["eval_steps"]) == (12, 2, 6)
    assert config["run_name"] == "hf-run" and config["report_to"] == ["wandb"]
    assert config["output_dir"] == "out" and config["hidden_size"] == 16
    assert config["id2label"] == {"0": "neg", "1": "pos"}
    assert config["model/num_parameters"] > 0

    # Summary: the user's keys (the train_* figures HF writes into it at the end among
    # them); every value but the timed ones equal.
    for summary in ("summary", "summary_file"):
        mine, theirs = getattr(plain.run, summary), getattr(funnel.run, summary)
        assert set(users(theirs)) == set(users(mine)), summary
        assert _deterministic(theirs) == _deterministic(mine), summary
    assert plain.run.summary["train/global_step"] == 12
    assert {"train_loss", "train_runtime", "total_flos"} <= set(plain.run.summary)
    # By design: the funnel's accounting (in the uploaded summary: the server's summary
    # table holds no key that starts with "_"). One rank attached: HF calls wandb on rank 0.
    extra = funnel.run.summary_file
    assert extra is not None
    assert funnels(plain.run.summary) == set() == funnels(funnel.run.summary)
    assert STEP_KEY not in extra
    assert extra["_funnel/ranks"] == 1 and extra["_funnel/rows"] == HF_ROWS
    assert extra["_funnel/dropped_records"] == extra["_funnel/late_records"] == 0

    # Files: the same names; requirements.txt the same bytes (the others: see above).
    assert set(plain.run.files) == set(funnel.run.files) == RUN_FILES
    assert funnel.run.read("requirements.txt") == plain.run.read("requirements.txt")

    # Logs: rank 0's console, the Trainer's log lines, the timed figures masked.
    def logs(job: Job) -> list[str]:
        timed = re.compile(r"('\w*(?:runtime|per_second)': )'[^']*'")
        return [timed.sub(r"\1'T'", line) for line in uploaded_output(job.run)]

    assert logs(funnel) == logs(plain)
    assert sum("'loss'" in line for line in logs(plain)) == len(HF_LOSS_STEPS)
