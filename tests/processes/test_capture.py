"""``wandb_funnel.testing.capture_run()`` as a user runs it: their own pytest file (a Funnel,
two spawned workers), in a process of its own, where wandb cannot even be imported."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from tests.conftest import PROGRAMS, Scripts, leftover_processes

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]


def test_a_users_test_gets_every_row_without_wandb(scripts: Scripts) -> None:
    # A wandb that fails on import, first on the path of every process of the job (owner,
    # logger, workers): under capture_run none of them may import wandb at all.
    poison = scripts.tmp_path / "poison" / "wandb"
    poison.mkdir(parents=True)
    (poison / "__init__.py").write_text("raise ImportError('wandb imported under capture_run')\n")
    path = os.pathsep.join([str(poison.parent), os.environ.get("PYTHONPATH", "")])
    # The user's test file in a directory of its own, as a user has it (not under our tests/,
    # whose conftest and pyproject would apply).
    shutil.copy(PROGRAMS / "user_test_capture.py", scripts.tmp_path / "test_my_logging.py")
    before = set(os.listdir(scripts.tmp_path))
    pytest_argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "test_my_logging.py",
    ]
    env = {"PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = scripts.run_command(pytest_argv, env, timeout=100)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout
    # No run directory, and the capture's own directory (under TMPDIR) is gone.
    assert set(os.listdir(scripts.tmp_path)) == before
    assert not leftover_processes(scripts.mark)
