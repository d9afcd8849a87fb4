"""A funnel job runs one wandb-core (issue 35, item 3): the logger's, which owns the run. The
owner starts none (it only forwards), and neither do the ranks. Before, the owner's
``wandb.setup()`` started a second one that nothing used (about 30 MB and 0.5 s at start)."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import PROGRAMS, Scripts, program, reports
from tests.wandb_reader import find_runs

pytestmark = [pytest.mark.processes]
ONE_CORE = program("one_core")


def test_a_funnel_job_runs_one_wandb_core(scripts: Scripts) -> None:
    res = scripts.run_file(ONE_CORE, ["count"], timeout=120)
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["workers_exit"] == [0, 0]
    assert len(info["cores"]) == 1, info["cores"]
    assert len(find_runs(scripts.wandb_dir)) == 1


def test_an_installed_job_runs_one_wandb_core(scripts: Scripts) -> None:
    """Through ``wandb-funnel run``: the owner's ``wandb.init`` is the funnel's."""
    argv = [sys.executable, "-m", "wandb_funnel", "run", "--"]
    program_file = str(PROGRAMS / "one_core.py")
    res = scripts.run_command([*argv, sys.executable, program_file, "count", "--installed"])
    assert res.returncode == 0, res.stderr
    info = reports(res.stdout)
    assert info["workers_exit"] == [0, 0]
    assert len(info["cores"]) == 1, info["cores"]
    runs = find_runs(scripts.wandb_dir)
    assert len(runs) == 1
    keys = {key for row in runs[0].history for key in row}
    assert {"w1", "w2"} <= keys, sorted(keys)
