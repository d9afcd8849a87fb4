"""A ``WANDB_FUNNEL_<OPTION>`` variable acts through every entry point (issue 35, item 2):
``wf.Funnel``, ``wf.init``, ``install()``, ``wandb-funnel run`` and the installed
``wandb.init`` of the processes they start, read back from the run; under torchrun, a
``wf.init`` job gets its stall report from ``WANDB_FUNNEL_STALL_TIMEOUT`` (before issue 35
nothing was said within 35 s: ``wf.init`` ignored the variable); a bad value is an error
that names the variable. The rule itself: tests/test_options.py."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.conftest import Scripts, program, reports
from tests.processes.test_health import HEALTH, _read_until, _stop, _wait_for_the_run
from tests.wandb_reader import WandbRun, only_run

pytestmark = [pytest.mark.processes, pytest.mark.sink("record"), pytest.mark.timeout(200)]

OPTIONS = program("option_variables")
FUNNEL_RUN = [sys.executable, "-m", "wandb_funnel", "run"]
SHARED = {"WANDB_FUNNEL_RUN_MODE": "shared"}


def _run(scripts: Scripts, way: str, env: dict[str, str]) -> WandbRun:
    result = scripts.run_file(OPTIONS, [way], extra_env=env)
    assert result.returncode == 0, result.stderr
    assert reports(result.stdout)["child"] == 0, result.stderr
    assert not result.leftovers, result.leftovers
    return only_run(scripts.wandb_dir)


def _column(run: WandbRun, key: str) -> list[object]:
    return [value for _, value in run.column(key)]


@pytest.mark.parametrize("way", ["funnel", "install"])
def test_the_run_mode_variable_acts_through_funnel_and_install(scripts: Scripts, way: str) -> None:
    """``WANDB_FUNNEL_RUN_MODE=shared``: each rank's ``x`` as ``x/rank{N}``."""
    run = _run(scripts, way, SHARED)
    assert _column(run, "x/rank0") == [1, 1, 1]
    assert _column(run, "x/rank1") == [2, 2, 2]


def test_the_reduce_variable_acts_through_init(scripts: Scripts) -> None:
    """``WANDB_FUNNEL_REDUCE=sum`` around ``wf.init``'s private funnel: ``x`` is 1 + 2."""
    run = _run(scripts, "init", {"WANDB_FUNNEL_REDUCE": "sum"})
    assert _column(run, "x") == [3, 3, 3]
    assert not _column(run, "x/rank0")


def test_wandb_funnel_run_takes_variables_under_its_flags_in_every_process(
    scripts: Scripts,
) -> None:
    """Under ``wandb-funnel run``: the variable acts in the command's installed
    ``wandb.init`` (shared keys), and a flag wins over its variable (``--reduce sum`` over
    ``WANDB_FUNNEL_REDUCE=max``: ``x`` is 3, not 2), through the export to every process."""
    env = {**SHARED, "WANDB_FUNNEL_REDUCE": "max"}
    proc = scripts.run_command(
        [*FUNNEL_RUN, "--reduce", "sum", "--", sys.executable, str(OPTIONS), "plain"], env, 120
    )
    assert proc.returncode == 0, proc.stderr
    assert reports(proc.stdout)["child"] == 0, proc.stderr
    run = only_run(scripts.wandb_dir)
    assert _column(run, "x/rank0") == [1, 1, 1]
    assert _column(run, "x/rank1") == [2, 2, 2]
    assert _column(run, "x") == [3, 3, 3]


def test_wandb_funnel_run_names_a_bad_variable(scripts: Scripts) -> None:
    proc = scripts.run_command([*FUNNEL_RUN, "--", "true"], {"WANDB_FUNNEL_RUN_MODE": "all"}, 60)
    assert proc.returncode == 2
    assert "WANDB_FUNNEL_RUN_MODE='all': run_mode must be one of" in proc.stderr
    flag = scripts.run_command(  # a flag overrides it: the variable is not read
        [*FUNNEL_RUN, "--run-mode", "auto", "--", "true"], {"WANDB_FUNNEL_RUN_MODE": "all"}, 60
    )
    assert flag.returncode == 0, flag.stderr


@pytest.mark.timeout(240)
def test_the_stall_timeout_variable_names_a_wedged_rank_of_a_wf_init_job(
    scripts: Scripts,
) -> None:
    """The issue's measured case: 4 torchrun ranks calling ``wf.init`` with no
    ``stall_timeout=``, ``WANDB_FUNNEL_STALL_TIMEOUT=10`` around the job, rank 3 stopped
    before step 30 while the others wedge in all_reduce: a line names rank 3 within 35 s."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    proc = subprocess.Popen(
        [*torchrun, "--nproc-per-node", "4", str(HEALTH), "stall", "--options-from-env"],
        cwd=scripts.tmp_path,
        env=scripts.env({"WANDB_FUNNEL_STALL_TIMEOUT": "10"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _read_until(proc, '"ready"', "stdout", 120)
        t0 = time.monotonic()
        _, err = _read_until(proc, "rank 3 is behind", "stderr", 35 + 30)
        assert time.monotonic() - t0 < 35 + 10, "the report came late"  # as test_health's
        line = next(x for x in err.splitlines() if "rank 3 is behind" in x)
        assert "rank 3 is behind: last step 29; ranks 0-2 at step 30" in line
    finally:
        _stop(scripts, proc)
    run = _wait_for_the_run(scripts)
    assert run.summary["_funnel/stalls"] >= 1
