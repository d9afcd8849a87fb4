"""A logger started ahead of time, when an installed process imports wandb (issue 34, item
7: a 3-log script took 1.3 s longer than plain wandb's, most of it the logger's start)."""

from __future__ import annotations

import psutil
import pytest

from tests.conftest import Scripts, program, reports
from tests.wandb_reader import find_runs

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]

PREWARM = program("prewarm")
INSTALLED = {"_WANDB_FUNNEL_INSTALL": "{}"}


def _installed(scripts: Scripts) -> dict[str, str]:
    from wandb_funnel._wandb_module.hooks import BOOTSTRAP_DIR

    return {**INSTALLED, "PYTHONPATH": BOOTSTRAP_DIR}


def test_a_script_that_never_calls_init_leaves_no_logger(scripts: Scripts) -> None:
    res = scripts.run_file(PREWARM, ["never-init"], extra_env=_installed(scripts))
    assert res.returncode == 0, res.stderr
    pid = reports(res.stdout)["warm_pid"]
    assert isinstance(pid, int)  # it was started ...
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert res.leftovers == []  # ... and is gone with the script


def test_the_run_takes_the_environment_and_directory_of_its_init(scripts: Scripts) -> None:
    res = scripts.run_file(PREWARM, ["init-late"], extra_env=_installed(scripts))
    assert res.returncode == 0, res.stderr
    seen = reports(res.stdout)
    assert seen["warm_pid"] is not None and seen["logger_pid"] == seen["warm_pid"]
    later = scripts.tmp_path / "later"
    assert (later / seen["run_dir"]).is_dir()  # dir="." meant "later", init's directory
    (run,) = find_runs(later)
    assert run.summary["_funnel/records"] == 1
    assert run.name == "late"
    assert run.project == "set-after-import"  # set after `import wandb`, before init
    assert res.leftovers == []
