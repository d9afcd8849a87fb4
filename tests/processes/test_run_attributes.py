"""``run.name = ...``, ``run.notes = ...``, ``run.tags = [...]`` as plain wandb sets them (issue
34, item 1): the same script run with plain wandb and under ``wandb-funnel run --``, and the
same values set from a spawn worker (rank 1) through ``wf.init``; what the runs wrote (their
last run record: display name, notes, tags) is read back from the ``.wandb`` files and
compared. A restarted logger keeps them: tests/processes/test_restart.py."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.conftest import PROGRAMS, Scripts, leftover_processes, reports, side_by_side
from tests.wandb_reader import WandbRun, find_runs

pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]

PROGRAM = str(PROGRAMS / "run_attributes.py")
FUNNEL_RUN = [sys.executable, "-m", "wandb_funnel", "run", "--"]
SET = ("renamed", "notes set mid-run", ["a", "b"])  # what the program sets
TAG_WARNING = (
    "Invalid tag detected: Tag at index 0 is empty. Tags must be between 1 and 64 characters "
    "Tags not updated."
)


def _rows(run: WandbRun) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if not k.startswith("_")} for row in run.history]


def _job(scripts: Scripts, argv: list[str]) -> tuple[dict[str, Any], str, list[WandbRun]]:
    # wandb speaks as it does for a user: its warning for bad tags is compared too.
    proc = scripts.run_command(argv, {"WANDB_SILENT": "false"}, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert leftover_processes(scripts.mark) == []
    runs = sorted(find_runs(scripts.wandb_dir), key=lambda run: run.name)
    return reports(proc.stdout), proc.stderr, runs


def test_name_notes_and_tags_set_from_any_rank_are_plain_wandbs(
    scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    plain_dir, spawn_dir = (
        Scripts(tmp_path_factory.mktemp("plain")),
        Scripts(tmp_path_factory.mktemp("spawn")),
    )
    plain, funnel, spawned = side_by_side(
        lambda: _job(plain_dir, [sys.executable, PROGRAM, "script"]),
        lambda: _job(scripts, [*FUNNEL_RUN, sys.executable, PROGRAM, "script"]),
        lambda: _job(spawn_dir, [sys.executable, PROGRAM, "spawn-rank"]),
    )
    # What the script read back, and raised: the same (a bad name or notes is a ValueError,
    # tags that are not iterable a TypeError; a finished run refuses with wandb's UsageError).
    assert funnel[0] == plain[0]
    assert plain[0]["seen"] == {
        "name": SET[0],
        "notes": SET[1],
        "tags": SET[2],
        "errors": {"name": "ValueError", "notes": "ValueError", "tags": "TypeError"},
    }
    assert plain[0]["finished"][0] == "UsageError"
    # Bad tags: wandb's own warning, and the run keeps the tags it had.
    assert TAG_WARNING in plain[1] and TAG_WARNING in funnel[1]
    # What the runs hold: the last run record says the values set, in all three.
    [plain_run], [funnel_run], [spawn_run] = plain[2], funnel[2], spawned[2]
    for run in (plain_run, funnel_run, spawn_run):
        assert (run.name, run.notes, run.tags) == SET, run.path
    assert funnel_run.summary["_funnel/records"] > 0  # it did go through the funnel
    assert _rows(funnel_run) == _rows(plain_run) == [{"x": 1}, {"x": 2}]
    # wandb's telemetry says the run's name and tags were set, as plain's does
    for run in (funnel_run, spawn_run):
        features = run.telemetry.get("feature", {})
        assert features.get("set_run_name") and features.get("set_run_tags"), features
    # The spawn worker was rank 1 and read back what it set (the wf.Run's own warning).
    assert spawned[0]["seen"]["rank"] == 1
    assert {k: v for k, v in spawned[0]["seen"].items() if k != "rank"} == plain[0]["seen"]
    assert spawned[0]["worker_exit"] == 0
    assert "Tags not updated." in spawned[1]


def test_wandbs_cross_validation_example_sets_the_sweep_runs_notes(
    scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """wandb's sweeps cross-validation example (two folds): it crashed at ``sweep_run.notes
    = ...`` and its workers then waited on their queues forever."""
    plain_dir = Scripts(tmp_path_factory.mktemp("plain"))
    argv = [sys.executable, PROGRAM, "cross-validation"]
    plain, funnel = side_by_side(
        lambda: _job(plain_dir, argv), lambda: _job(scripts, [*FUNNEL_RUN, *argv])
    )
    assert funnel[0] == plain[0] == {"folds": 2, "exits": [0, 0], "name": "sweep"}

    def runs(job: tuple[Any, str, list[WandbRun]]) -> list[tuple[Any, ...]]:
        return [
            (r.name, r.notes, r.tags, r.group, [sorted(row) for row in _rows(r)]) for r in job[2]
        ]

    assert runs(funnel) == runs(plain)
    assert runs(plain)[0][:2] == ("sweep", "None/groups/unknown")
    # Nothing of the funnel's own on the terminal: each fold's private run is what plain
    # wandb makes there (issue 34: "no funnel found in this child process" once a fold).
    assert not [line for line in funnel[1].splitlines() if "wandb-funnel" in line], funnel[1]
