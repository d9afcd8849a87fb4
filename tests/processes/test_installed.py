"""``install()`` and ``wandb-funnel run`` end to end: plain wandb code, real processes, and the
runs read back from the ``.wandb`` files, compared with plain wandb's where we claim to match."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import PROGRAMS, Scripts, leftover_processes, program, reports, side_by_side
from tests.wandb_reader import WandbRun, find_runs

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

FUNNEL_RUN = [sys.executable, "-m", "wandb_funnel", "run"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
BOOKKEEPING = ("_",)  # wandb's own keys and the funnel's accounting (_funnel/*)


def _user(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if not k.startswith(BOOKKEEPING)}


def _surface(scripts: Scripts, *args: str) -> tuple[dict[str, Any], WandbRun]:
    result = scripts.run_file(program("installed_api"), ["surface", *args])
    assert result.returncode == 0, result.stderr
    assert not result.leftovers, result.leftovers
    runs = find_runs(scripts.wandb_dir)
    assert len(runs) == 1, [r.path for r in runs]
    return reports(result.stdout), runs[0]


def test_the_wandb_api_through_the_funnel_matches_plain_wandb(
    scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    plain_scripts = Scripts(tmp_path_factory.mktemp("plain"))
    (seen, funnel), (plain_seen, plain) = side_by_side(
        lambda: _surface(scripts), lambda: _surface(plain_scripts, "--plain")
    )
    # What the script saw: wandb.run before and after, the run's properties, config access.
    assert seen == plain_seen
    assert seen["name"] == "surface-run" and seen["change_without_allow"] == "ConfigError"
    assert seen["int_keys"] == {"0": "neg", "1": "pos"}
    assert seen["finished_calls"]["log"] == (
        "Run (ID) is finished. The call to `log` will be ignored. Please make sure that you "
        "are using an active run."
    )
    # What the run holds: the same rows (step= and commit= as wandb treats them), config,
    # name, group, summary and the user's own step metric.
    assert funnel.summary["_funnel/records"] > 0  # it did go through the funnel
    assert [_user(r) for r in funnel.history] == [_user(r) for r in plain.history]
    assert _user(funnel.config) == _user(plain.config)
    assert (funnel.name, funnel.group) == (plain.name, plain.group) == ("surface-run", "g1")
    assert _user(plain.summary).items() <= _user(funnel.summary).items()
    assert all(m in funnel.metrics for m in plain.metrics), (plain.metrics, funnel.metrics)
    assert funnel.exit_code == plain.exit_code == 0


def test_install_holds_in_every_kind_of_child_process(scripts: Scripts) -> None:
    result = scripts.run_file(program("installed_api"), ["children"], timeout=200)
    assert result.returncode == 0, result.stderr
    assert not result.leftovers, result.leftovers
    installed = reports(result.stdout)["installed"]
    assert installed == {
        "spawn": [True] * 2,
        "forkserver": [True] * 2,
        "fork": [True] * 2,
        "dataloader-spawn": [True] * 2,
    }
    run = find_runs(scripts.wandb_dir)
    assert len(run) == 1  # every child's wandb.init joined the owner's run
    values = sorted(v for _, v in run[0].column("child"))
    assert values == [0, 1, 10, 11, 20, 21]
    assert run[0].summary["_funnel/dropped_records"] == 0


def _cli(scripts: Scripts, argv: list[str], env: dict[str, str] | None = None) -> Any:
    return scripts.run_command([*FUNNEL_RUN, *argv], env)


def test_funnel_run_exits_with_the_commands_code_and_exports_the_options(
    scripts: Scripts,
) -> None:
    code = "import os, sys; print(os.environ['_WANDB_FUNNEL_INSTALL']); sys.exit(3)"
    proc = _cli(
        scripts,
        ["--reduce", "loss=max", "--reduce", "acc=min", "--", sys.executable, "-c", code],
        {"WANDB_FUNNEL_RUN_MODE": "shared"},  # a variable; the flags add to it
    )
    assert proc.returncode == 3, proc.stderr
    exported = json.loads(proc.stdout)
    assert exported == {"run_mode": "shared", "reduce": {"loss": "max", "acc": "min"}}
    missing = _cli(scripts, ["--", "no-such-command-here"])
    assert missing.returncode == 127 and "command not found" in missing.stderr
    bad = _cli(scripts, ["--close-timeout", "soon", "--", "true"])
    assert bad.returncode == 2 and "close_timeout must be a number" in bad.stderr
    assert not leftover_processes(scripts.mark)


def test_funnel_run_takes_the_command_without_dashes_and_the_tool_has_a_version(
    scripts: Scripts,
) -> None:
    """``wandb-funnel run python train.py`` runs it (issue 23: it failed with the top-level
    usage); a ``--`` inside the command stays the command's; ``--version`` answers."""
    code = "import os, sys; print(sys.argv[1:], os.environ['_WANDB_FUNNEL_INSTALL'])"
    proc = _cli(scripts, ["--reduce", "loss=max", sys.executable, "-c", code, "--x", "--", "-y"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == """['--x', '--', '-y'] {"reduce": {"loss": "max"}}"""
    none = _cli(scripts, [])
    assert none.returncode == 2 and "no command" in none.stderr
    version = subprocess.run(
        [*FUNNEL_RUN[:-1], "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    from wandb_funnel._version import __version__

    assert version.returncode == 0 and version.stdout.strip() == f"wandb-funnel {__version__}"


@pytest.mark.parametrize("launch", ["torchrun", "alone"])
def test_a_users_own_global_step_is_kept_as_plain_wandb_keeps_it(
    scripts: Scripts, tmp_path_factory: pytest.TempPathFactory, launch: str
) -> None:
    """``log({"global_step": 1000 * (i + 1), ...})`` reads back 1000, 2000, ... as with plain
    wandb (issue 23: the funnel wrote its own step, 0, 1, 2, over it, and said nothing)."""
    command = [
        *(TORCHRUN if launch == "torchrun" else [sys.executable]),
        str(PROGRAMS / "user_global_step.py"),
    ]
    plain_scripts = Scripts(tmp_path_factory.mktemp("plain"))
    plain = plain_scripts.run_command(command)
    assert plain.returncode == 0, plain.stderr[-4000:]
    funnel = _cli(scripts, command)
    assert funnel.returncode == 0, funnel.stderr[-4000:]
    (plain_run,) = find_runs(plain_scripts.wandb_dir)
    (funnel_run,) = find_runs(scripts.wandb_dir)
    assert funnel_run.summary["_funnel/records"] == 6  # it did go through the funnel
    expected = [1000 * (i + 1) for i in range(6)]
    assert [v for _, v in plain_run.column("global_step")] == expected
    assert [v for _, v in funnel_run.column("global_step")] == expected

    def rows(run: WandbRun) -> list[dict[str, Any]]:
        return [
            {k: v for k, v in r.items() if k == "_step" or not k.startswith(("_", "t_"))}
            for r in run.history
        ]

    assert rows(funnel_run) == rows(plain_run)
    assert "global_step" not in funnel.stderr  # nothing to say: the key is the user's alone
    assert not leftover_processes(scripts.mark)


def test_funnel_run_makes_every_rank_one_run_with_the_reducers_it_was_given(
    scripts: Scripts,
) -> None:
    client = str(PROGRAMS / "client_every_rank.py")
    proc = _cli(scripts, ["--reduce", "loss=max", "--", *TORCHRUN, client])
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = find_runs(scripts.wandb_dir)
    assert len(runs) == 1, [r.path for r in runs]  # plain wandb: one run per rank
    run = runs[0]
    assert run.group == "DDP" and run.summary["_funnel/ranks"] == 2
    assert [v for _, v in run.column("loss")] == [1.0 + step for step in range(10)]  # max
    assert [v for _, v in run.column("rank")] == [0.5] * 10  # the default: mean
    assert not leftover_processes(scripts.mark)


def test_funnel_run_new_mode_gives_a_run_per_rank(scripts: Scripts) -> None:
    client = str(PROGRAMS / "client_every_rank.py")
    proc = _cli(scripts, ["--run-mode", "new", "--", *TORCHRUN, client])
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = sorted(find_runs(scripts.wandb_dir), key=lambda r: r.run_id)
    assert len(runs) == 2
    for rank, run in enumerate(runs):
        assert run.run_id.endswith(f"-rank-{rank}")
        assert [v for _, v in run.column("loss")] == [float(rank + s) for s in range(10)]
    assert not leftover_processes(scripts.mark)


def test_mp_spawn_ranks_with_only_a_process_group_make_one_run(scripts: Scripts) -> None:
    result = scripts.run_file(program("installed_api"), ["mp-spawn"], timeout=200)
    assert result.returncode == 0, result.stderr
    assert not result.leftovers, result.leftovers
    runs = find_runs(scripts.wandb_dir)
    assert len(runs) == 1 and runs[0].name == "spawned"
    # reduce={"loss": "sum"} from install(), applied across the two ranks' rows.
    assert [v for _, v in runs[0].column("loss")] == [10.0 + 2 * s for s in range(5)]
    assert runs[0].summary["_funnel/ranks"] == 2


def test_the_legacy_launcher_is_a_launcher_too(scripts: Scripts) -> None:
    """``python -m torch.distributed.launch`` (deprecated, passes ``--local-rank``)."""
    client = str(PROGRAMS / "client_every_rank.py")
    launch = [sys.executable, "-m", "torch.distributed.launch", "--nproc-per-node", "2"]
    proc = _cli(scripts, ["--", *launch, client])
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = find_runs(scripts.wandb_dir)
    assert len(runs) == 1 and runs[0].summary["_funnel/ranks"] == 2
    assert not leftover_processes(scripts.mark)


def test_a_job_that_logs_from_its_last_rank_only_is_hosted_there(scripts: Scripts) -> None:
    """Megatron-LM and pipeline-parallel torchtitan call wandb.init on the last rank only:
    that rank hosts the funnel (rank 0, which never calls, is not waited for)."""
    client = str(PROGRAMS / "client_nanogpt.py")
    proc = _cli(scripts, ["--", *TORCHRUN, client], {"CLIENT_LOGGING_RANK": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = find_runs(scripts.wandb_dir)
    assert len(runs) == 1 and runs[0].name == "nano-run" and runs[0].exit_code == 0
    assert [v for _, v in runs[0].column("iter")] == list(range(0, 30, 3))
    assert not leftover_processes(scripts.mark)


@pytest.mark.parametrize("way", ["run", "install"])
def test_steps_and_a_partial_global_step_read_back_as_plain_wandb_writes_them(
    scripts: Scripts, tmp_path_factory: pytest.TempPathFactory, way: str
) -> None:
    """``_step`` follows ``log(step=)`` (issue 34: accelerate's 3, 6, 9 read back 0, 1, 2),
    a ``global_step`` the user logs on some rows stays on those rows only (it was filled
    into the others), and the run declares only the user's step metric (the funnel's
    ``"*" -> global_step`` moved the user's keys to another axis)."""
    command = [sys.executable, str(PROGRAMS / "steps_as_plain.py")]
    plain_scripts = Scripts(tmp_path_factory.mktemp("plain"))
    env = {"CLIENT_INSTALL": "1"} if way == "install" else None
    plain, funnel = side_by_side(
        lambda: plain_scripts.run_command(command),
        lambda: scripts.run_command(command, env) if way == "install" else _cli(scripts, command),
    )
    assert plain.returncode == 0, plain.stderr[-4000:]
    assert funnel.returncode == 0, funnel.stderr[-4000:]
    (plain_run,) = find_runs(plain_scripts.wandb_dir)
    (funnel_run,) = find_runs(scripts.wandb_dir)
    assert funnel_run.summary["_funnel/records"] > 0  # it did go through the funnel

    def rows(run: WandbRun) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k == "_step" or k[0] != "_"} for r in run.history]

    assert [r["_step"] for r in plain_run.history] == [3, 6, 9, 12, 15, 18, 19]
    assert rows(funnel_run) == rows(plain_run)
    assert funnel_run.metrics == plain_run.metrics
    assert sum("global_step" in r for r in funnel_run.history) == 3
    assert funnel_run.summary["_funnel/late_records"] == 0
    assert "late" not in funnel.stderr, funnel.stderr[-4000:]
    assert not leftover_processes(scripts.mark)
