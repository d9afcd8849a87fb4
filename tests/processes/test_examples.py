"""examples/: each way in (``wandb-funnel run --`` on an unmodified script, ``install()``,
Lightning's ``FunnelLogger``, ``capture_run`` in a user's pytest file) run as its docstring
and examples/README.md say, and the run it leaves read back from what wandb wrote."""

from __future__ import annotations

import ast
import os
import pathlib
import shutil
import sys

import pytest

from tests.conftest import Scripts, leftover_processes
from tests.wandb_reader import WandbRun, find_runs

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def _tool(script: str, module: str) -> list[str]:
    """A console script of this environment (``wandb-funnel``, ``torchrun``), as a user types
    it; ``python -m module`` where the environment has no scripts directory beside Python."""
    path = pathlib.Path(sys.executable).with_name(script)
    return [str(path)] if path.exists() else [sys.executable, "-m", module]


# --standalone: a free rendezvous port (the default, 29500, is shared by every job on the box).
TORCHRUN = [*_tool("torchrun", "torch.distributed.run"), "--standalone", "--nproc-per-node", "2"]
FUNNEL_RUN = [*_tool("wandb-funnel", "wandb_funnel"), "run"]


def _one_run(scripts: Scripts, argv: list[str], timeout: float = 200) -> WandbRun:
    """Run ``argv`` in the scenario's directory (offline wandb into its WANDB_DIR): exit 0,
    one run, nothing left running."""
    proc = scripts.run_command(argv, timeout=timeout)
    tail = f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0, tail
    runs = find_runs(scripts.wandb_dir)
    assert len(runs) == 1, f"expected one run, found {[r.path for r in runs]}\n{tail}"
    assert not leftover_processes(scripts.mark)
    return runs[0]


def _every_rank_in_every_row(run: WandbRun, key: str, steps: int, samples: int) -> None:
    """Both ranks' ``rank{r}/<key>`` in every row, ``key`` their mean (the default reducer),
    ``samples`` their sum (the example's reducer), one row per step, nothing lost."""
    assert [row["_step"] for row in run.history] == list(range(steps))
    for row in run.history:
        per_rank = [row[f"rank{r}/{key}"] for r in range(2)]
        assert row[key] == pytest.approx(sum(per_rank) / 2), row
        assert row["samples"] == samples, row
    assert run.exit_code == 0
    assert run.summary["_funnel/ranks"] == 2
    assert run.summary["_funnel/records"] == 2 * steps
    assert run.summary["_funnel/dropped_records"] == 0
    assert run.summary["_funnel/late_records"] == 0


def _top_level_imports(path: pathlib.Path) -> set[str]:
    """The top-level packages a Python file imports, at any depth of its code."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_an_unmodified_script_under_wandb_funnel_run_makes_one_run(scripts: Scripts) -> None:
    """``wandb-funnel run --reduce samples=sum -- torchrun ... examples/unmodified/train.py``:
    a script that never imports wandb_funnel, whose two ranks each call ``wandb.init`` (two
    runs with plain wandb), makes one run with both ranks' values in every row."""
    example = EXAMPLES / "unmodified" / "train.py"
    imported = _top_level_imports(example)
    assert "wandb" in imported and "wandb_funnel" not in imported, imported
    argv = [*FUNNEL_RUN, "--reduce", "samples=sum", "--", *TORCHRUN, str(example)]
    run = _one_run(scripts, argv)
    _every_rank_in_every_row(run, "loss", steps=20, samples=64)
    assert run.history[-1]["loss"] < run.history[0]["loss"] / 10  # it trained
    assert run.group == "ddp"
    assert run.config["world_size"] == 2 and run.config["steps"] == 20


def test_install_in_a_script_that_spawns_its_ranks_makes_one_run(scripts: Scripts) -> None:
    """``python examples/install_one_line.py``: ``install()`` at the top, ranks started by
    ``torch.multiprocessing.spawn`` with plain wandb calls, one run (``reduce=`` from
    ``install``) with rank 0's summary."""
    run = _one_run(scripts, [sys.executable, str(EXAMPLES / "install_one_line.py")])
    _every_rank_in_every_row(run, "accuracy", steps=20, samples=64)
    assert run.name == "install-one-line"
    assert run.config["ranks"] == 2
    assert all("loss" in row for row in run.history)
    assert run.summary["final_accuracy"] == run.history[-1]["rank0/accuracy"]
    assert run.summary["final_accuracy"] > 0.8  # the two clouds are told apart


def test_lightning_funnel_logger_brings_both_ranks_into_every_row(scripts: Scripts) -> None:
    """``python examples/lightning_funnel_logger.py``: Lightning's own launcher starts the
    second rank; each rank's ``self.log`` (no ``sync_dist``) reaches the run, reduced by the
    funnel (the ranks' mean ``rank`` is 0.5; ``samples`` summed), and the hyperparameters
    are the run's config."""
    run = _one_run(scripts, [sys.executable, str(EXAMPLES / "lightning_funnel_logger.py")])
    # 128 samples, batches of 16 split over 2 ranks: 4 steps an epoch, 2 epochs.
    assert [row["trainer/global_step"] for row in run.history] == list(range(8))
    assert [row["epoch"] for row in run.history] == [0] * 4 + [1] * 4
    assert all(row["rank"] == 0.5 for row in run.history), run.history
    assert all(row["samples"] == 32 for row in run.history), run.history
    assert all("train_loss" in row for row in run.history)
    assert run.name == "lightning-every-rank" and run.exit_code == 0
    assert run.config["lr"] == 0.05 and run.config["features"] == 8
    assert run.summary["_funnel/ranks"] == 2
    assert run.summary["_funnel/records"] == 2 * run.summary["_funnel/rows"] == 16
    assert run.summary["_funnel/dropped_records"] == 0


@pytest.mark.parametrize("training", ["as-is", "logs-a-wrong-key"])
def test_a_users_capture_run_test_passes_and_catches_a_wrong_key(
    scripts: Scripts, training: str
) -> None:
    """``python -m pytest examples/capture_run/test_my_training.py`` passes, and leaves no
    run directory behind; with the training changed to log ``val_loss`` where its test
    expects ``loss``, the same test fails and says which keys the row had."""
    example = EXAMPLES / "capture_run"
    if training == "as-is":
        test_file = example / "test_my_training.py"
    else:  # the user's two files, the training's key changed
        user = scripts.tmp_path / "user"
        shutil.copytree(example, user, ignore=shutil.ignore_patterns("__pycache__"))
        code = (user / "my_training.py").read_text()
        assert code.count('"loss": loss') == 1
        (user / "my_training.py").write_text(code.replace('"loss": loss', '"val_loss": loss'))
        test_file = user / "test_my_training.py"
    before = set(os.listdir(scripts.tmp_path))
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)]
    proc = scripts.run_command(argv, {"PYTHONDONTWRITEBYTECODE": "1"}, timeout=150)
    out = proc.stdout[-6000:] + proc.stderr[-3000:]
    if training == "as-is":
        assert proc.returncode == 0, out
        assert "1 passed" in proc.stdout, out
    else:
        assert proc.returncode == 1, out
        assert "1 failed" in proc.stdout, out
        assert "AssertionError: step 0 has [" in proc.stdout and "'val_loss'" in proc.stdout, out
    # No run directory and no recording left. (Only wandb's own temporary directories, which
    # a Pool worker that imports wandb leaves in TMPDIR with plain wandb too: it leaves
    # through os._exit, past their finalizers.)
    left = set(os.listdir(scripts.tmp_path)) - before
    assert not {n for n in left if not n.endswith(("wandb-media", "wandb-artifacts"))}, left
    assert not leftover_processes(scripts.mark)
