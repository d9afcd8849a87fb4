"""``wandb-funnel soak -- COMMAND``: the harness pointed at a user's own program, end to end,
through the command's entry point (``wandb_funnel.cli.main``), reading its report back."""

from __future__ import annotations

import json
import pathlib
import shlex
import sys
from typing import Any

import pytest

from wandb_funnel.cli import main
from wandb_funnel.soak import jobenv

PROGRAM = pathlib.Path(__file__).resolve().parents[1] / "programs" / "soak_user.py"
pytestmark = [pytest.mark.soak, pytest.mark.processes]


def _soak(tmp_path: pathlib.Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "out"
    rc = main(["soak", "--iterations", "1", "--out", str(out), "--seed", "t", "--keep", *args])
    return rc, json.loads((out / "soak.json").read_text())


def _gone(report: dict[str, Any]) -> None:
    """No process of any iteration's job is alive (killing any, so none is left behind)."""
    for it in report["runs"]:
        assert it["mark"]
        assert jobenv.leftover_processes(it["mark"], grace=5) == []


@pytest.mark.timeout(300)
def test_a_users_command_gets_its_faults_and_a_report(tmp_path: pathlib.Path) -> None:
    command = [sys.executable, str(PROGRAM), "--seconds", "3"]
    rc, report = _soak(
        tmp_path,
        "--fault",
        "none",
        "--fault",
        "kill-worker",
        "--fault-after",
        "1:2",
        "--deadline",
        "150",
        "--jobs",  # the two iterations side by side: half the wait (a fault waits for its
        "2",  # worker to exist, so a slower start under load only delays it)
        "--",
        *command,
    )
    _gone(report)
    runs = {it["scenario"]: it for it in report["runs"]}
    assert rc == 0, [it["problems"] for it in report["runs"]]
    assert sorted(runs) == ["kill-worker", "none"]
    assert report["target"] == shlex.join(command)
    for it in runs.values():
        assert not it["hang"] and it["problems"] == []
        assert it["leftover_processes"] == [] and it["leftover_sockets"] == []
        # Read back from the .wandb file: the owner finished the run with 0.
        assert it["run_exits"] == [0] and it["runs"][0]["exit_code"] == 0
        assert it["duration_s"] > 0
        assert not it["probe_used"] and it["sent"] == it["logged"] == it["lost"] == 0
    base, killed = runs["none"], runs["kill-worker"]
    assert base["owner_exit"] == 0 and base["fault"] is None and base["fault_at_s"] is None
    # The fault found the spawn worker (not the owner, logger, wandb-core or multiprocessing's
    # resource tracker); the owner saw it die and still ended normally.
    assert killed["fault"] == "kill-worker" and killed["fault_done"]
    assert killed["fault_at_s"] >= 1 and killed["exit_s"] is not None
    stdout = pathlib.Path(killed["directory"], "stdout.txt").read_text()
    assert "worker exit code -9" in stdout
    assert killed["owner_exit"] == 0
    rows = {row["scenario"]: row for row in report["scenarios"]}
    assert rows["kill-worker"]["owner_exits"] == "0" and rows["kill-worker"]["faults_missed"] == 0
    assert rows["none"]["run_exits"] == "0" and rows["none"]["failed"] == 0
    table = (tmp_path / "out" / "soak.md").read_text()
    assert "owner exit codes" in table and "Exit codes are reported, not judged" in table


@pytest.mark.timeout(240)
def test_a_command_that_hangs_on_exit_is_a_hang(tmp_path: pathlib.Path) -> None:
    rc, report = _soak(
        tmp_path,
        "--fault",
        "none",
        "--deadline",
        "20",
        "--",
        sys.executable,
        str(PROGRAM),
        "--seconds",
        "0.5",
        "--hang-on-exit",
    )
    _gone(report)
    assert rc == 1
    (it,) = report["runs"]
    assert it["hang"] and it["owner_exit"] is None
    assert any(p.startswith("hang: still running after its 20s deadline") for p in it["problems"])
    (row,) = report["scenarios"]
    assert row["hangs"] == 1 and row["failed"] == 1 and row["owner_exits"] == "hang"
