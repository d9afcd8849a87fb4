"""The soak harness's own checks catch what they claim to: a hang, a process left behind,
records lost without a reason, a wrong exit code. Each case is a small misbehaving program."""

from __future__ import annotations

import pathlib
import textwrap

import pytest

from wandb_funnel.soak.harness import run_iteration
from wandb_funnel.soak.scenarios import Scenario

pytestmark = pytest.mark.soak


def _scenario(tmp_path: pathlib.Path, code: str, **kw: object) -> Scenario:
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(code))
    return Scenario("misbehaving", "a program that breaks a rule", str(program), **kw)  # type: ignore[arg-type]


def test_a_hang_is_caught_and_killed(tmp_path: pathlib.Path) -> None:
    scenario = _scenario(tmp_path, "import time\ntime.sleep(600)\n", deadline=2, run_exit=None)
    it = run_iteration(scenario, 1, tmp_path / "out", "s")
    assert it.hang and not it.ok
    assert any("hang" in p for p in it.problems)


def test_a_process_left_behind_is_caught(tmp_path: pathlib.Path) -> None:
    code = """
    import subprocess, sys
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                     start_new_session=True)
    """
    it = run_iteration(_scenario(tmp_path, code, deadline=20, run_exit=None), 1,
                       tmp_path / "out", "s")
    assert not it.hang and len(it.leftover_processes) == 1
    assert any("left behind" in p for p in it.problems)


def test_records_lost_without_a_reason_are_caught(tmp_path: pathlib.Path) -> None:
    code = """
    import wandb_funnel as wf
    from wandb_funnel.soak import probe
    with wf.Funnel(project="t"):
        for step in range(10):
            wf.log({"r1": step}, step=step)
            probe.count(1)
        probe.count(1, 5)  # claims five records it never logged
    """
    it = run_iteration(_scenario(tmp_path, code), 1, tmp_path / "out", "s")
    assert (it.sent, it.logged, it.dropped, it.lost) == (15, 10, 0, 5)
    assert it.problems == ["5 records lost without a reason"]


def test_a_wrong_exit_code_is_caught(tmp_path: pathlib.Path) -> None:
    code = """
    import sys, wandb_funnel as wf
    from wandb_funnel.soak import probe
    wf.init(project="t").log({"r0": 1}); probe.count(0)
    sys.exit(3)
    """
    it = run_iteration(_scenario(tmp_path, code), 1, tmp_path / "out", "s")
    assert it.owner_exit == 3 and it.run_exits == [3]
    assert any("owner exit code 3" in p for p in it.problems)
    assert any("run exit records [3]" in p for p in it.problems)
