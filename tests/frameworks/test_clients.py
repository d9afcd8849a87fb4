"""Real clients, under their real launchers, with 2 processes on gloo/CPU: each runs once with
plain wandb and once through the funnel (``install()`` in the script, or ``wandb-funnel run
--`` around an unchanged command), and the two runs are compared as wandb wrote them.

The funnel's run must hold every history key and row, config key and summary key of the
plain run, carry the name the user gave, be the only run, and end with exit code 0.
"""

from __future__ import annotations

import pathlib
import socket
import sys
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import PROGRAMS, Scripts, leftover_processes, side_by_side
from tests.wandb_reader import WandbRun, find_runs

pytestmark = [pytest.mark.processes, pytest.mark.frameworks, pytest.mark.timeout(600)]

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
FUNNEL_RUN = [sys.executable, "-m", "wandb_funnel", "run", "--"]
# wandb's own bookkeeping, and the funnel's: not what the user logged
NOT_USERS = {"_step", "_runtime", "_timestamp", "_wandb", "global_step"}


# accelerate's own launcher; --multi_gpu is its torchrun path (the script asks for cpu=True
# and gloo), while --cpu would start one process.
ACCELERATE_LAUNCH = [
    sys.executable,
    "-m",
    "accelerate.commands.launch",
    "--multi_gpu",
    "--num_processes",
    "2",
    "--num_machines",
    "1",
    "--mixed_precision",
    "no",
    "--dynamo_backend",
    "no",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _command(client: str, out: pathlib.Path) -> list[str]:
    if client == "accelerate-launch":
        # A port of its own: accelerate's default, 29500, is any other job's too (a CI run
        # failed on EADDRINUSE there; torchrun's --standalone picks a free one itself).
        port = ["--main_process_port", str(_free_port())]
        return [*ACCELERATE_LAUNCH, *port, str(PROGRAMS / "client_accelerate.py")]
    program = str(PROGRAMS / f"client_{client}.py")
    if client == "lightning":  # Lightning starts its second process itself
        return [sys.executable, program, str(out)]
    return [*TORCHRUN, program, *([str(out)] if client == "hf" else [])]


CLIENTS: dict[str, str] = {  # client -> the run name the user gave
    "nanogpt": "nano-run",
    "hf": "hf-run",
    "accelerate": "acc-run",  # under torchrun
    "accelerate-launch": "acc-run",  # under `accelerate launch`
    "lightning": "pl-run",
}


def _run(scripts: Scripts, argv: list[str], extra_env: dict[str, str]) -> WandbRun:
    proc = scripts.run_command(argv, extra_env, timeout=400)
    tail = f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0, tail
    runs = find_runs(scripts.wandb_dir)
    assert len(runs) == 1, f"expected one run, found {[r.path for r in runs]}\n{tail}"
    return runs[0]


def _users(keys: Any) -> set[str]:
    return {k for k in keys if k not in NOT_USERS and not k.startswith(("_funnel/", "_wandb"))}


def _rows(run: WandbRun) -> list[set[str]]:
    return [_users(row) for row in run.history]


_plain_runs: dict[str, WandbRun] = {}


def _plain(client: str, tmp_path_factory: pytest.TempPathFactory) -> WandbRun:
    """The plain-wandb run of ``client`` (run once per session)."""
    if client not in _plain_runs:
        scripts = Scripts(tmp_path_factory.mktemp(f"plain-{client}"))
        _plain_runs[client] = _run(scripts, _command(client, scripts.tmp_path), {})
    return _plain_runs[client]


def _compare(plain: WandbRun, funnel: WandbRun, name: str) -> None:
    assert plain.name == funnel.name == name
    assert plain.exit_code == funnel.exit_code == 0
    assert plain.history, "the plain run logged nothing: the client is broken"
    assert _rows(funnel) == _rows(plain)  # every row, in order, with every key
    for key in _users(plain.history[-1]):  # the last value of each key
        assert funnel.history[-1].get(key) is not None, key
    assert _users(plain.config) <= _users(funnel.config), _users(plain.config) - _users(
        funnel.config
    )
    assert _users(plain.summary) <= _users(funnel.summary), _users(plain.summary) - _users(
        funnel.summary
    )
    assert funnel.summary["_funnel/dropped_records"] == 0


VARIANTS: dict[str, Callable[[list[str]], tuple[list[str], dict[str, str]]]] = {
    "install": lambda argv: (argv, {"CLIENT_INSTALL": "1"}),  # the one line in the script
    "run": lambda argv: ([*FUNNEL_RUN, *argv], {}),  # no line at all
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_client_through_the_funnel_keeps_everything_plain_wandb_had(
    client: str, variant: str, scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    argv, env = VARIANTS[variant](_command(client, scripts.tmp_path))
    plain, funnel = side_by_side(
        lambda: _plain(client, tmp_path_factory), lambda: _run(scripts, argv, env)
    )
    assert funnel.summary.get("_funnel/records", 0) > 0, "the run did not go through the funnel"
    _compare(plain, funnel, CLIENTS[client])
    assert not leftover_processes(scripts.mark), leftover_processes(scripts.mark)


def test_lightning_funnel_logger_brings_every_rank(
    scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``FunnelLogger`` in place of ``WandbLogger``: the same run, with both ranks' metrics
    in every row (reduced by the funnel, not by an all_reduce), and the hyperparameters."""
    plain = _plain("lightning", tmp_path_factory)
    argv = _command("lightning", scripts.tmp_path)
    funnel = _run(scripts, argv, {"CLIENT_FUNNEL_LOGGER": "1"})
    _compare(plain, funnel, "pl-run")
    assert funnel.summary["_funnel/ranks"] == 2
    # Every row was logged by both ranks: twice the records of the rows.
    assert funnel.summary["_funnel/records"] == 2 * funnel.summary["_funnel/rows"]
    steps = [row["trainer/global_step"] for row in funnel.history]
    assert steps == [row["trainer/global_step"] for row in plain.history]
    assert all(type(s) is int for s in steps)  # kept as logged, not averaged into floats
    assert funnel.config["lr"] == plain.config["lr"] == 0.05


def test_lightning_ddp_spawn_says_nothing_of_the_funnels_own(
    scripts: Scripts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``strategy="ddp_spawn"``: each spawned rank's ``WandbLogger`` re-inits the run the
    main process made, with ``id=`` and ``resume="allow"``: a normal framework path, so no
    warning (issue 34: a FunnelWarning pointing into ``_api.py`` appeared twice); the run is
    plain wandb's."""
    argv = [sys.executable, str(PROGRAMS / "client_lightning.py"), "{out}", "ddp_spawn"]
    plain_scripts = Scripts(tmp_path_factory.mktemp("plain-spawn"))

    def job(where: Scripts, prefix: list[str]) -> Any:
        command = [*prefix, *(str(where.tmp_path) if a == "{out}" else a for a in argv)]
        proc = where.run_command(command, {}, timeout=400)
        assert proc.returncode == 0, proc.stderr[-6000:]
        (run,) = find_runs(where.wandb_dir)
        return proc, run

    (_, plain), (f_proc, funnel) = side_by_side(
        lambda: job(plain_scripts, []), lambda: job(scripts, FUNNEL_RUN)
    )
    assert funnel.summary.get("_funnel/records", 0) > 0
    _compare(plain, funnel, "pl-run")
    ours = [line for line in f_proc.stderr.splitlines() if "wandb-funnel" in line]
    assert ours == [], ours
    assert "FunnelWarning" not in f_proc.stderr
    assert not leftover_processes(scripts.mark), leftover_processes(scripts.mark)
