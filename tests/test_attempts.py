"""``_attempts.py``: which job a process is, which attempt of it, and which run it continues
(pure, on a temporary wandb directory). End to end: tests/processes/test_requeue.py."""

from __future__ import annotations

import os
import pathlib

import pytest

from wandb_funnel import _attempts
from wandb_funnel._attempts import Attempt, Job, job_of, plan, record, segments_of

ARGV = ["train.py", "--lr", "0.1"]


def _env(root: pathlib.Path, **more: str) -> dict[str, str]:
    return {"WANDB_DIR": str(root), **more}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"TORCHELASTIC_RUN_ID": "r1"}, Job("torchrun run r1", 0, 0)),
        (
            {"TORCHELASTIC_RUN_ID": "r1", "TORCHELASTIC_RESTART_COUNT": "2"},
            Job("torchrun run r1", 2, 2),
        ),
        ({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"}, Job("SLURM job 7", 1, 1000)),
        (  # an array task is a job of its own
            {"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3"},
            Job("SLURM job 7_3", 0, 0),
        ),
        (  # torchrun inside a requeued SLURM job: SLURM's count first
            {
                "SLURM_JOB_ID": "7",
                "SLURM_RESTART_COUNT": "1",
                "TORCHELASTIC_RUN_ID": "x",
                "TORCHELASTIC_RESTART_COUNT": "2",
            },
            Job("SLURM job 7", 1, 1002),
        ),
        ({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "junk"}, Job("SLURM job 7", 0, 0)),
    ],
)
def test_the_job_is_named_by_its_scheduler(environ: dict[str, str], expected: Job | None) -> None:
    assert job_of(environ) == expected


def _attempt(root: pathlib.Path, restart: int, argv: list[str] = ARGV, **kw: object) -> Attempt:
    env = _env(root, SLURM_JOB_ID="7", SLURM_RESTART_COUNT=str(restart))
    found = plan(dict(kw), "continue", env, argv)
    assert found is not None
    return found


def test_a_requeue_continues_the_run_and_a_rerun_after_it_finished_does_not(
    tmp_path: pathlib.Path,
) -> None:
    first = _attempt(tmp_path, 0)
    assert not first.continues and first.number == 1
    record(first, "running")
    # Killed outright (still "running"): the same attempt again continues it.
    assert _attempt(tmp_path, 0).run_id == first.run_id
    record(first, "done", 143)  # SIGTERM: the requeue comes
    second = _attempt(tmp_path, 1)
    assert second.run_id == first.run_id and second.continues and second.number == 2
    assert "restart 1 of SLURM job 7" in second.said()
    record(second, "done", 0)
    # The same training again in the same attempt after it finished: a run of its own.
    again = _attempt(tmp_path, 1)
    assert again.run_id != first.run_id and not again.continues


def test_other_trainings_in_one_allocation_get_other_runs(tmp_path: pathlib.Path) -> None:
    base = _attempt(tmp_path, 0)
    assert _attempt(tmp_path, 0, ["train.py", "--lr", "0.01"]).run_id != base.run_id
    assert _attempt(tmp_path, 0, name="other").run_id != base.run_id
    assert _attempt(tmp_path, 0, project="p2").run_id != base.run_id
    assert _attempt(tmp_path, 0).run_id == base.run_id  # deterministic: nothing recorded yet


def test_restarts_new_and_a_plain_process_plan_nothing(tmp_path: pathlib.Path) -> None:
    env = _env(tmp_path, SLURM_JOB_ID="7")
    assert plan({}, "new", env, ARGV) is None
    assert plan({}, "continue", _env(tmp_path), ARGV) is None


def test_the_users_own_id_continues_what_is_on_disk(tmp_path: pathlib.Path) -> None:
    env = _env(tmp_path)
    fresh = plan({"id": "myrun"}, "continue", env, ARGV)
    assert fresh is not None and not fresh.continues and fresh.job == "run myrun"
    segment = tmp_path / "wandb" / "offline-run-20260101_000000-myrun" / "run-myrun.wandb"
    segment.parent.mkdir(parents=True)
    segment.write_bytes(b"")
    again = plan({"id": "myrun"}, "continue", env, ARGV)
    assert again is not None and again.continues and again.segments == [str(segment)]


def test_segments_are_found_oldest_first_and_no_other_runs(tmp_path: pathlib.Path) -> None:
    names = [
        "offline-run-20261129_101010-abc-1",
        "run-20261128_000000-abc",
        "offline-run-20261129_101010-abc",
        "offline-run-20261129_101010-abcd",  # another id that starts the same
        "offline-run-20261129_090000-xabc",  # another id that ends the same
    ]
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "run-abc.wandb").write_bytes(b"")
    assert [os.path.basename(os.path.dirname(p)) for p in segments_of(str(tmp_path), "abc")] == [
        "run-20261128_000000-abc",
        "offline-run-20261129_101010-abc",
        "offline-run-20261129_101010-abc-1",
    ]


def test_ids_are_wandb_shaped_and_the_record_survives_a_read_only_dir(
    tmp_path: pathlib.Path,
) -> None:
    run_id = _attempts.derived_id("key", 0)
    assert len(run_id) == 8 and run_id.isalnum() and run_id.islower()
    assert _attempts.derived_id("key", 1) != run_id
    attempt = Attempt(run_id, "SLURM job 7", 0, 0, 1, [], str(tmp_path / "missing" / "x"))
    (tmp_path / "missing").write_text("a file where the directory would go")
    record(attempt, "running")  # never raises
    assert Attempt.from_wire(attempt.to_wire()) == attempt
