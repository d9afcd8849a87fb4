"""``wandb.init(sync_tensorboard=True)`` through the funnel: the same script runs with plain
wandb and through the funnel (``install()`` in the script, or ``wandb-funnel run --`` around
it), and the two runs are compared as wandb wrote them: the history wandb-core read from the
tfevents files (every key's values at their ``global_step``), the ``tbrecord`` records, and
the tfevents files among the run's files (on disk, under the run's ``files/``).

Before this was built, the funnel's run had 0 history rows, no ``tbrecord`` and no tfevents
file (wandb patched the logger's tensorboard, not the script's), with nothing said.
"""

from __future__ import annotations

import collections
import re
import sys
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import PROGRAMS, Scripts, leftover_processes, program, reports, side_by_side
from tests.wandb_reader import WandbRun, find_runs

pytestmark = [pytest.mark.processes, pytest.mark.timeout(400)]

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
FUNNEL_RUN = [sys.executable, "-m", "wandb_funnel", "run", "--"]
# wandb's bookkeeping, written by wandb-core at the time it read the events: not the events'
BOOKKEEPING = {"_step", "_runtime", "_timestamp"}
_EVENTS_FILE = re.compile(r"events\.out\.tfevents\.[^/]+$")


def _run(scripts: Scripts, argv: list[str], env: dict[str, str]) -> list[WandbRun]:
    proc = scripts.run_command(argv, env, timeout=300)
    tail = f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0, tail
    assert not leftover_processes(scripts.mark), leftover_processes(scripts.mark)
    runs = find_runs(scripts.wandb_dir)
    assert runs, f"no run\n{tail}"
    return runs


def columns(run: WandbRun, prefix: str = "", skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every history key (under ``prefix``, which is taken off) -> its (global_step, value)
    pairs, sorted: wandb-core reads each log directory on a thread of its own, so rows of two
    directories may interleave in another order in two runs of the same script."""
    out: dict[str, list[tuple[int, Any]]] = collections.defaultdict(list)
    for row in run.history:
        # wandb-core writes the event's step as "global_step" (0.31), or under the events'
        # namespace, "train/global_step" (wandb 0.22): bookkeeping either way.
        steps = [k for k in row if k == "global_step" or k.endswith("/global_step")]
        for key, value in row.items():
            if key in BOOKKEEPING or key in steps or not key.startswith(prefix):
                continue
            name = key[len(prefix) :]
            if not name.startswith(skip):
                out[name].append((row[steps[0]], value))
    return {key: sorted(values) for key, values in out.items()}


def tfevents(run: WandbRun, run_id: str = "") -> list[str]:
    """The tfevents files the run saved (``files`` records), each checked on disk: a link in
    the run's ``files/`` to the events the script wrote. Named without their time, host and
    pid (which differ between two runs), and with the run's own id as ``RUN``."""
    names = []
    for path in run.files:
        if not _EVENTS_FILE.search(path):
            continue
        saved = run.path.parent / "files" / path
        assert saved.is_file() and saved.stat().st_size > 0, saved
        names.append(_EVENTS_FILE.sub("events", path.replace(run_id or "\0", "RUN")))
    return sorted(names)


def tbrecords(run: WandbRun, run_id: str = "") -> list[tuple[str, bool, str]]:
    return sorted(
        (r["log_dir"].replace(run_id or "\0", "RUN"), bool(r.get("save")), r.get("root_dir", ""))
        for r in run.tbrecords
    )


def _compare_one(plain: WandbRun, funnel: WandbRun, skip: tuple[str, ...] = ()) -> None:
    assert plain.history, "the plain run read no events: the script is broken"
    assert len(funnel.history) == len(plain.history)
    assert columns(funnel, skip=skip) == columns(plain, skip=skip)
    assert tbrecords(funnel, funnel.run_id) == tbrecords(plain, plain.run_id)
    assert tfevents(funnel, funnel.run_id) == tfevents(plain, plain.run_id)
    assert tfevents(plain)  # the comparison above was not of two empty lists
    assert funnel.name == plain.name
    assert funnel.exit_code == plain.exit_code == 0
    assert funnel.summary["_funnel/dropped_records"] == 0
    assert funnel.summary.get("_funnel/unsupported_calls", 0) == 0


VARIANTS: dict[str, Callable[[list[str]], tuple[list[str], dict[str, str]]]] = {
    "install": lambda argv: (argv, {"CLIENT_INSTALL": "1"}),  # the one line in the script
    "run": lambda argv: ([*FUNNEL_RUN, *argv], {}),  # no line at all
}
_plain_runs: dict[str, list[WandbRun]] = {}


def _plain(
    name: str, argv: list[str], env: dict[str, str], factory: pytest.TempPathFactory
) -> list[WandbRun]:
    if name not in _plain_runs:
        scripts = Scripts(factory.mktemp(f"plain-{name}"))
        _plain_runs[name] = _run(scripts, argv, env)
    return _plain_runs[name]


@pytest.mark.parametrize("writer", ["torch", "tensorboardX"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_one_process_gets_plain_wandbs_tensorboard_history_files_and_tbrecords(
    variant: str, writer: str, scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    env = {"CLIENT_TBX": "1"} if writer == "tensorboardX" else {}
    argv = [sys.executable, str(PROGRAMS / "client_tensorboard.py")]
    command, extra = VARIANTS[variant](argv)
    (plain,), (funnel,) = side_by_side(
        lambda: _plain(f"tb-{writer}", argv, env, tmp_path_factory),
        lambda: _run(scripts, command, {**env, **extra}),
    )
    _compare_one(plain, funnel)
    # Two directories: wandb names each one's keys by it (train/loss, eval/loss).
    assert {"train/loss", "eval/loss", "train/accuracy"} <= set(columns(funnel))
    assert len(columns(funnel)["train/loss"]) == 12


@pytest.mark.frameworks
def test_every_rank_of_a_torchrun_job_writes_tensorboard_into_the_one_run(
    scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Both ranks call ``wandb.init(sync_tensorboard=True)`` and write their own directory.
    Plain wandb makes a run per rank; the funnel's one run holds both ranks' events, each
    under its directory's name (wandb's naming for several log directories), with the
    values of the plain run of that rank."""
    argv = [*TORCHRUN, str(PROGRAMS / "client_tensorboard.py")]
    plain = {run.name: run for run in _plain("tb-ddp", argv, {}, tmp_path_factory)}
    assert sorted(plain) == ["tb-rank0", "tb-rank1"]
    (funnel,) = _run(scripts, [*FUNNEL_RUN, *argv], {})
    assert funnel.summary["_funnel/ranks"] == 2
    assert len(funnel.history) == sum(len(run.history) for run in plain.values())
    for rank in (0, 1):
        ours = columns(funnel, prefix=f"rank{rank}/")
        assert ours == columns(plain[f"tb-rank{rank}"]), rank
        assert len(ours["loss"]) == 12
    assert tbrecords(funnel) == sorted(
        record for run in plain.values() for record in tbrecords(run)
    )
    assert [name.rsplit("/", 2)[-2:] for name in tfevents(funnel)] == [
        ["rank0", "events"],
        ["rank1", "events"],
    ]


@pytest.mark.frameworks
def test_stable_baselines3_ppo_under_wandb_funnel_run_matches_plain_wandb(
    scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A real program nobody here wrote: SB3's PPO on CartPole-v1 logs through its own
    tensorboard logger, as wandb's SB3 integration documents; unchanged under
    ``wandb-funnel run --``. SB3's ``time/*`` keys are wall-clock figures (fps, seconds):
    their steps are compared, not their values."""
    pytest.importorskip("stable_baselines3")
    argv = [sys.executable, str(PROGRAMS / "client_sb3.py")]
    (plain,) = _plain("sb3", argv, {}, tmp_path_factory)
    (funnel,) = _run(scripts, [*FUNNEL_RUN, *argv], {})
    _compare_one(plain, funnel, skip=("time/",))
    steps = {key: [s for s, _ in values] for key, values in columns(funnel).items()}
    assert steps == {key: [s for s, _ in values] for key, values in columns(plain).items()}
    assert "train/value_loss" in steps and "time/fps" in steps
    assert funnel.summary["_funnel/records"] == 0  # SB3 never calls wandb.log: all came from tb


@pytest.mark.frameworks
def test_sb3_with_wandbs_callback_gives_plain_wandbs_rows_keys_and_model(
    scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """SB3's ``WandbCallback(gradient_save_freq=, model_save_path=)`` with
    ``sync_tensorboard``: the gradient histograms (``commit=False``, from a process that never
    commits) merge into tensorboard's rows as in plain wandb, and the model is saved with
    ``base_path`` (issue 34: 19 rows against plain's 2, 396 late records, and no
    ``model.zip``)."""
    pytest.importorskip("stable_baselines3")
    argv = [sys.executable, str(PROGRAMS / "client_sb3.py"), "--callback"]
    plain_scripts = Scripts(tmp_path_factory.mktemp("plain-sb3-callback"))
    (plain,), (funnel,) = side_by_side(
        lambda: _run(plain_scripts, argv, {}), lambda: _run(scripts, [*FUNNEL_RUN, *argv], {})
    )
    assert len(funnel.history) == len(plain.history)
    keys = {key for row in plain.history for key in row if key not in BOOKKEEPING}
    assert any(key.startswith("gradients/") for key in keys)  # the histograms are there
    assert {key for row in funnel.history for key in row if key not in BOOKKEEPING} == keys
    assert [sorted(r) for r in funnel.history] == [sorted(r) for r in plain.history]
    assert "model.zip" in plain.files and "model.zip" in funnel.files
    assert (funnel.path.parent / "files" / "model.zip").stat().st_size > 0
    assert funnel.summary["_funnel/records"] > 0  # the histograms went through the funnel
    assert funnel.summary["_funnel/late_records"] == 0
    assert funnel.summary["_funnel/dropped_records"] == 0
    assert funnel.summary.get("_funnel/dropped_files", 0) == 0


@pytest.mark.parametrize(
    ("scenario", "not_carried"),
    [("wf-init", ["sync_tensorboard", "monitor_gym"]), ("installed", ["capture_loggers"])],
)
def test_keywords_that_cannot_act_in_the_caller_warn_once_and_are_counted(
    scenario: str, not_carried: list[str], scripts: Scripts
) -> None:
    """Through ``wf.init`` (wandb's module not installed) the tensorboard and gym patches
    cannot reach the funnel's run; ``capture_loggers`` would hook the logger process's
    loggers. Each warns once and counts in ``_funnel/unsupported_calls``. Installed,
    ``monitor_gym`` acts in the caller (wandb's gym patch is applied there)."""
    result = scripts.run_file(program("init_keywords"), [scenario])
    assert result.returncode == 0, result.stderr
    assert not result.leftovers, result.leftovers
    seen = reports(result.stdout)
    assert [n for n in not_carried if any(f"({n}=" in w for w in seen["warnings"])] == not_carried
    assert len(seen["warnings"]) == len(not_carried)
    (run,) = find_runs(scripts.wandb_dir)
    assert run.summary["_funnel/unsupported_calls"] == len(not_carried)
    assert run.history and run.history[0]["x"] == 1  # the run itself went on
    assert bool(seen["gym_patched"]) is (scenario == "installed")
