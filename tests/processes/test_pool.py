"""multiprocessing Pools and Processes funnel into one run: every record, in step order."""

from __future__ import annotations

import os
import pathlib
import stat
import sys

import pytest

from tests.conftest import Scripts, program, reports
from tests.wandb_reader import only_run

pytestmark = [pytest.mark.processes, pytest.mark.sink("record")]  # the funnel's semantics
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
POOL = program("pool")  # the owner process of the scenarios that are not examples


def run_example(scripts: Scripts, name: str, *args: str) -> str:
    """Run ``examples/<name>`` as a user would, in the scenario's WANDB_DIR; returns stdout."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=scripts.tmp_path,
        env=scripts.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,  # its stderr shows in the failure below
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_pool_workers_log_every_step(scripts: Scripts, method: str) -> None:
    """Pool workers started by each start method log through wf.log; the run has every
    record, one row per step, in step order, exit code 0, and nothing is left behind."""
    res = scripts.run_file(POOL, ["pool-workers", "--method", method])
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    run = only_run(scripts.wandb_dir)
    steps = [row["_step"] for row in run.history]
    assert steps == list(range(60))
    assert [v for _, v in run.column("score")] == [n * n for n in range(60)]
    assert run.column("lr") == [(0, 0.1)]
    assert run.exit_code == 0
    assert run.summary["_funnel/records"] == 61
    assert run.summary["_funnel/dropped_records"] == 0
    assert run.summary["_funnel/ranks"] == 1 + info["workers"]
    assert info["stats"]["_funnel/records"] == 61
    assert res.leftovers == []
    assert not os.path.exists(info["address"][len("ipc://") :])
    assert not os.path.exists(os.path.dirname(info["address"][len("ipc://") :]))


def test_example_pool_spawn_4x200(scripts: Scripts) -> None:
    """The README demo: 4 spawn workers x 200 steps read back with all 800 records, one row
    per step in step order, loss reduced by mean and throughput by sum, exit code 0."""
    run_example(scripts, "pool_spawn.py", "--workers", "4", "--steps", "200")
    run = only_run(scripts.wandb_dir)
    assert [row["_step"] for row in run.history] == list(range(200))
    assert run.exit_code == 0
    assert run.summary["_funnel/records"] == 801
    assert run.summary["_funnel/dropped_records"] == 0
    assert run.summary["_funnel/late_records"] == 0
    for row in run.history:
        assert row["throughput"] == 400.0  # 4 workers x 100, reduce="sum"
        per_worker = [row[f"worker_loss.w{w}"] for w in range(4)]
        assert row["loss"] == pytest.approx(sum(per_worker) / 4)  # default mean
    assert run.config["workers"] == 4


def test_spawn_process_pattern(scripts: Scripts) -> None:
    """W&B's "Spawn process" pattern: each Pool task's init() is a new rank, steps from 0,
    in one shared-mode run with per-rank keys, and each task's config lands in the run."""
    stdout = run_example(scripts, "spawn_process.py", "--tasks", "6")
    assert "ranks [1, 2, 3, 4, 5, 6]" in stdout
    run = only_run(scripts.wandb_dir)
    for rank in range(1, 7):
        col = run.column(f"acc/rank{rank}")
        assert [s for s, _ in col] == list(range(10)), (rank, col)
    assert {f"task_{i}_seed" for i in range(6)} <= set(run.config)
    assert run.summary["_funnel/records"] == 60
    assert run.exit_code == 0


def test_share_run_pattern(scripts: Scripts) -> None:
    """W&B's "Share a run" pattern: a Run passed to spawned children; their records land."""
    stdout = run_example(scripts, "share_run.py", "--children", "2")
    assert "exit codes [0, 0]" in stdout
    run = only_run(scripts.wandb_dir)
    for child in range(2):
        assert sorted(s for s, _ in run.column(f"child{child}/seen")) == list(range(20))
    assert run.summary["_funnel/records"] == 60
    assert run.summary["_funnel/dropped_records"] == 0


def test_fork_child_never_reuses_parent_socket(scripts: Scripts) -> None:
    """A forked child that uses the owner's Run object (inherited) and wf.log attaches as a
    new rank on its own socket; all records arrive."""
    res = scripts.run_file(POOL, ["fork-child"])
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["exitcode"] == 0
    run = only_run(scripts.wandb_dir)
    assert run.column("via_inherited_run") == [(1, 1)]
    assert run.column("via_wf_log") == [(2, 2)]
    assert info["stats"]["_funnel/ranks"] == 3  # owner, inherited Run, wf.log
    assert info["stats"]["_funnel/junk_frames"] == 0


def test_socket_dir_is_private(scripts: Scripts) -> None:
    """The IPC socket lives in a 0700 directory while the funnel runs, and is gone after."""
    res = scripts.run_file(POOL, ["socket-dir"])
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["mode"] == 0o700 and info["exists"]
    assert not os.path.exists(os.path.dirname(info["path"]))
    assert stat.S_IMODE(0o700) == info["mode"]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_child_that_logs_while_being_unpickled_still_flushes_at_exit(
    scripts: Scripts, method: str
) -> None:
    """A child imports its target's module while unpickling its Process object; for
    forkserver that is before multiprocessing's bootstrap clears the finalizer registry. A
    module that logs at import must still flush and say goodbye when the child exits (it
    leaves through os._exit, so only a multiprocessing finalizer can): every record in the
    run, no rank counted dead. (The module is tests/programs/logs_at_import.py.)"""
    res = scripts.run_file(POOL, ["child-logs-while-unpickled", "--method", method])
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["child_exit"] == 0
    assert info["stats"]["_funnel/dead_ranks"] == 0, res.stderr
    run = only_run(scripts.wandb_dir)
    assert [v for _, v in run.column("at_import")] == list(range(10))
    assert res.leftovers == []


@pytest.mark.sink("wandb")
def test_the_demo_leaves_no_temporary_directory(scripts: Scripts) -> None:
    """The README demo into real wandb leaves nothing in TMPDIR: the logger leaves through
    ``os._exit``, past the finalizers of the ``TemporaryDirectory`` objects wandb makes at
    import (``tmp*wandb-media``, ``tmp*wandb-artifacts``), so it removes them itself; a plain
    wandb script leaves none either. (It left both, every run, before.)"""
    before = set(os.listdir(scripts.tmp_path))
    run_example(scripts, "pool_spawn.py", "--workers", "2", "--steps", "20")
    assert only_run(scripts.wandb_dir).summary["_funnel/records"] == 41
    left = set(os.listdir(scripts.tmp_path)) - before
    assert {n for n in left if n != "wandb"} == set(), left
