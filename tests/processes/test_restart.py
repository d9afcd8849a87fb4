"""The logger may die; the run may not (issue 26): a SIGKILL of the logger, of its
wandb-core or of the owner mid-run leaves every step of every worker in the run exactly
once, under one run id, read back from every segment wandb wrote."""

from __future__ import annotations

import collections
import time
from typing import Any

import pytest
import wandb

from tests.conftest import MARK_VAR, Scripts, program, reports
from tests.wandb_reader import WandbRun, find_runs, read_run, step_of
from wandb_funnel.sinks.recording import rows_in

pytestmark = [pytest.mark.processes]
RESTART = program("restart")
STEPS = 600
ATTRIBUTES = ("set-by-rank-2", "notes of rank 2", ["r2", "restart"])  # restart.py's


def _every_step_once(run: WandbRun, steps: int = STEPS) -> None:
    for worker in ("w1", "w2"):
        seen = collections.Counter(step_of(row) for row in run.history if worker in row)
        missing = sorted(set(range(steps)) - set(seen))
        twice = sorted(step for step, n in seen.items() if n > 1)
        assert not missing and not twice, f"{worker}: missing {missing[:20]}, twice {twice[:20]}"
        assert all(row[worker] == step_of(row) for row in run.history if worker in row)
    # one row per step: the rows of the two workers merged, as without a restart
    assert sorted(step_of(row) for row in run.history) == list(range(steps))


def _attributes_in_every_segment(run: WandbRun) -> None:
    """What worker 2 set (``--attributes``) before the first death: every segment's last run
    record says it, a restarted logger's too (issue 34)."""
    name, notes, tags = ATTRIBUTES
    # Before wandb 0.31 (no x_transaction_log_flush_interval) a killed logger's segment holds
    # only whole 32 KiB blocks: its last run record can die with it. The finished segment,
    # the last, says it on every wandb.
    flushed = "x_transaction_log_flush_interval" in wandb.Settings.model_fields
    for segment in run.segments if flushed else run.segments[-1:]:
        seen = read_run(segment)
        assert (seen.name, seen.notes, seen.tags) == (name, notes, tags), segment


def _the_run(scripts: Scripts, info: dict[str, Any]) -> WandbRun:
    runs = find_runs(scripts.wandb_dir)
    assert [r.run_id for r in runs] == [info["run_id"]], "one run id, whatever died"
    return runs[0]


@pytest.mark.parametrize("kill", ["logger", "core"])
def test_a_killed_logger_or_wandb_core_costs_no_step(scripts: Scripts, kill: str) -> None:
    """SIGKILL to the logger (or its wandb-core) once both workers are past step 150: the
    owner starts a new logger, which continues the run in a new segment; the workers resend
    what was not saved; every step is in the run once; the job exits 0. The name, notes and
    tags a worker set are the new segment's too."""
    args = ["kill-mid-run", "--kill", kill, "--attributes"]
    res = scripts.run_file(RESTART, args, timeout=120)
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["workers_exit"] == [0, 0]
    assert info["restarts"] == 1
    assert "starting a new one (restart 1" in res.stderr
    run = _the_run(scripts, info)
    assert len(run.segments) == 2, run.segments
    _every_step_once(run)
    assert run.exit_code == 0
    assert run.summary["_funnel/logger_restarts"] == 1
    assert run.summary["_funnel/replayed_records"] > 0
    _attributes_in_every_segment(run)
    assert run.summary["_funnel/records"] == 2 * STEPS
    assert run.summary["_funnel/rows"] == STEPS
    assert run.summary["_funnel/dropped_records"] == 0
    assert info["stats"]["_funnel/records"] == 2 * STEPS
    # wandb's own step counter runs on across the segments, as in one process
    assert [step_of(row) for row in run.history] == list(range(STEPS))
    # each segment's own sync command, in order
    for segment in run.segments:
        assert f"wandb sync {segment.parent}" in res.stderr
    # the restart is one line in the run's console
    assert any("the logger was restarted" in r.get("line", "") for r in run.output_raw)
    assert not any("may be missing" in line for line in res.stderr.splitlines())
    assert res.leftovers == []


def test_a_killed_logger_costs_no_step_on_the_recording_sink(scripts: Scripts) -> None:
    """The restart path is the sink's as much as wandb's (the Journal asks a ``Restartable``
    sink what is on disk): the same kill, with the run recorded as JSON lines
    (``WANDB_FUNNEL_SINK=record:DIR``, as ``capture_run`` records it). One recording per
    segment; every step of each worker once, across both."""
    record = scripts.tmp_path / "recorded"
    record.mkdir()
    res = scripts.run_file(
        RESTART,
        ["kill-mid-run", "--kill", "logger"],
        120,
        extra_env={"WANDB_FUNNEL_SINK": f"record:{record}"},
    )
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["restarts"] == 1 and info["workers_exit"] == [0, 0]
    run_id = info["run_id"]
    segments = [record / f"{run_id}.jsonl", record / f"{run_id}.1.jsonl"]
    assert sorted(record.iterdir()) == sorted(segments)
    rows = [row for segment in segments for row in rows_in(str(segment))]
    for worker in ("w1", "w2"):
        seen = collections.Counter(step_of(row) for row in rows if worker in row)
        missing = sorted(set(range(STEPS)) - set(seen))
        twice = sorted(step for step, n in seen.items() if n > 1)
        assert not missing and not twice, f"{worker}: missing {missing[:20]}, twice {twice[:20]}"
    assert info["stats"]["_funnel/records"] == 2 * STEPS
    assert info["stats"]["_funnel/dropped_records"] == 0
    assert info["stats"]["_funnel/logger_restarts"] == 1
    assert res.leftovers == []


@pytest.mark.parametrize("kill", ["logger", "core"])
def test_a_rank_far_behind_when_the_logger_dies_loses_nothing(scripts: Scripts, kill: str) -> None:
    """Worker 2 attaches 1.5 s after worker 1 (its records are late: worker 1's rows of its
    steps are written already), and the logger (or its wandb-core, which ends the logger
    too) is SIGKILLed once worker 2 is past step 100.
    The dead logger's last rows hold steps worker 2 had not logged yet: its resent records of
    those steps are not in the run and must be written, not skipped as duplicates (they were,
    silently, found on the GPU machine: 29 steps of worker 2 missing, none counted)."""
    args = ["kill-mid-run", "--kill", kill, "--lag", "1.5", "--at", "100"]
    res = scripts.run_file(RESTART, args, timeout=120)
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["workers_exit"] == [0, 0] and info["restarts"] == 1
    run = _the_run(scripts, info)
    for worker in ("w1", "w2"):  # late rows repeat a step: each worker's records, once
        seen = collections.Counter(step_of(row) for row in run.history if worker in row)
        missing = sorted(set(range(STEPS)) - set(seen))
        twice = sorted(step for step, n in seen.items() if n > 1)
        assert not missing and not twice, f"{worker}: missing {missing[:30]}, twice {twice[:20]}"
    assert run.summary["_funnel/records"] == 2 * STEPS
    assert run.summary["_funnel/dropped_records"] == 0
    assert res.leftovers == []


def test_images_of_rows_not_yet_saved_survive_the_logger(scripts: Scripts) -> None:
    """Each worker logs an image every 10 steps. The logger is SIGKILLed mid-run: the images
    of rows it wrote but had not seen saved are still staged (a second name until the row is
    saved), so the resent records bring them into the run: every image once, none dropped."""
    res = scripts.run_file(RESTART, ["kill-mid-run", "--kill", "logger", "--media"], 120)
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    run = _the_run(scripts, info)
    _every_step_once(run)
    for worker in ("img1", "img2"):
        steps = sorted(step_of(row) for row in run.history if f"{worker}._type" in row)
        assert steps == list(range(0, STEPS, 10)), (worker, steps)
        types = {row[f"{worker}._type"] for row in run.history if f"{worker}._type" in row}
        assert types == {"image-file"}
    assert run.summary["_funnel/dropped_media"] == 0
    assert run.summary["_funnel/media"] == 2 * STEPS // 10
    assert res.leftovers == []


def test_three_logger_deaths_in_one_job(scripts: Scripts) -> None:
    """The logger is killed three times (each once the workers logged 50 steps with the one
    before): three restarts, four segments, every step once."""
    args = ["kill-mid-run", "--kill", "logger", "--times", "3", "--delay", "0.03", "--attributes"]
    res = scripts.run_file(RESTART, args, 180)
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["restarts"] == 3
    run = _the_run(scripts, info)
    assert len(run.segments) == 4, run.segments
    _every_step_once(run)
    assert run.summary["_funnel/logger_restarts"] == 3
    _attributes_in_every_segment(run)
    assert run.summary["_funnel/records"] == 2 * STEPS
    assert res.leftovers == []


def test_past_the_restart_bound_the_funnel_says_so(scripts: Scripts) -> None:
    """max_logger_restarts=1 and two deaths: one restart, then the funnel stops restarting,
    says so, and the workers count and report what they could not send; the job still
    exits 0 and never hangs."""
    args = ["kill-mid-run", "--kill", "logger", "--times", "2", "--max-restarts", "1"]
    res = scripts.run_file(RESTART, [*args, "--delay", "0.02"], 120)
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["restarts"] == 1
    assert "is not started again" in res.stderr
    run = _the_run(scripts, info)
    assert len(run.segments) == 2
    steps = {step_of(row) for row in run.history}
    # Everything saved before the second death: with wandb's 0.2 s flush, the steps to 200;
    # before wandb 0.31 (the log reaches disk in 32 KiB blocks) the block the second logger
    # had not written yet died with it: the steps to the first death (150), then.
    flushed = "x_transaction_log_flush_interval" in wandb.Settings.model_fields
    assert set(range(200 if flushed else 150)) <= steps
    assert "records from this rank may be missing" in res.stderr  # what it cost: said
    assert res.leftovers == []


def test_the_owners_death_leaves_the_workers_steps_and_a_failed_run(scripts: Scripts) -> None:
    """SIGKILL to the owner while its spawn workers run on: the logger (with a wandb-core of
    its own) writes every step they log, then ends the run with exit code 1."""
    proc = scripts.start_file(RESTART, ["kill-mid-run", "--kill", "owner"])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -9, err
    info = reports(out)
    assert info["killed"][0][0] == "owner"
    # The workers and the logger outlive the owner: wait (bounded) until they are done.
    deadline = time.monotonic() + 60
    while _alive(scripts):
        assert time.monotonic() < deadline, "the job did not end after the owner's death"
        time.sleep(0.2)
    run = _the_run(scripts, info)
    _every_step_once(run)
    assert run.exit_code == 1
    assert run.summary["_funnel/exit_reason"] == "owner lost"
    assert run.summary["_funnel/records"] == 2 * STEPS


def _alive(scripts: Scripts) -> bool:
    from wandb_funnel.soak import jobenv

    return bool(jobenv.marked_processes(scripts.mark, MARK_VAR))
