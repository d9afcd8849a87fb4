"""DDP ranks under real torchrun (gloo on CPU) funnel into exactly the runs asked for."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import Scripts, program, reports, torchrun_agents, wait_for_report
from tests.wandb_reader import WandbRun, find_runs

pytestmark = [pytest.mark.processes, pytest.mark.sink("record")]  # the funnel's semantics

STEPS = 15

DDP = program("ddp")  # one rank: MODE SCOPE BEHAVIOUR --steps N


def torchrun(
    scripts: Scripts, args: list[str], nproc: int, nnodes: int = 1, timeout: float = 120
) -> list[subprocess.CompletedProcess[str]]:
    """The DDP scenario under real torchrun (``torchrun_agents``)."""
    return torchrun_agents(
        scripts, [str(DDP), *args, "--steps", str(STEPS)], nproc, nnodes, timeout
    )


def runs_by_id(scripts: Scripts) -> dict[str, WandbRun]:
    return {r.run_id: r for r in find_runs(scripts.wandb_dir)}


def expected_loss(rank: int, step: int) -> float:
    return float((rank * 7 + step * 3) % 11) / 3.0


@pytest.mark.parametrize(
    ("mode", "scope", "runs"),
    [
        ("auto", "global", {"base": ("", [0, 1])}),
        ("auto", "worker", {"base-worker-0": ("", [0]), "base-worker-1": ("", [1])}),
        ("shared", "global", {"base": ("", [0, 1])}),
        ("shared", "worker", {"base-worker-0": ("", [0]), "base-worker-1": ("", [1])}),
        ("new", "global", {"base-rank-0": ("base", [0]), "base-rank-1": ("base", [1])}),
        (
            "new",
            "worker",
            {
                "base-worker-0-rank-0": ("base-worker-0", [0]),
                "base-worker-1-rank-0": ("base-worker-1", [1]),
            },
        ),
    ],
)
def test_mode_scope_matrix_on_two_nodes(
    scripts: Scripts, mode: str, scope: str, runs: dict[str, tuple[str, list[int]]]
) -> None:
    """Two "nodes" (two torchrun invocations, --nnodes 2, localhost master), one rank each:
    the job gets exactly the runs of the Flyte table, with their ids, groups, keys, values,
    step order and exit code 0."""
    results = torchrun(scripts, [mode, scope, "plain"], nproc=1, nnodes=2)
    for res in results:
        assert res.returncode == 0, res.stderr[-3000:]
    got = runs_by_id(scripts)
    assert set(got) == set(runs)
    for run_id, (group, ranks) in runs.items():
        run = got[run_id]
        assert run.group == group
        assert run.exit_code == 0
        assert [r["_step"] for r in run.history] == list(range(STEPS))
        for row in run.history:
            step = row["_step"]
            if mode == "shared":
                for rank in ranks:
                    assert row[f"loss/rank{rank}"] == pytest.approx(expected_loss(rank, step))
            else:
                want = sum(expected_loss(r, step) for r in ranks) / len(ranks)
                assert row["loss"] == pytest.approx(want)
                assert row["tput"] == len(ranks)  # reduce="sum"
            for rank in ranks:
                key = f"r{rank}/rank{rank}" if mode == "shared" else f"r{rank}"
                assert row[key] == step
        assert run.summary["_funnel/dropped_records"] == 0
    assert leftovers_empty(scripts)


def leftovers_empty(scripts: Scripts) -> bool:
    from tests.conftest import leftover_processes

    left = leftover_processes(scripts.mark)
    assert left == [], left
    return True


@pytest.mark.parametrize("scope", ["global", "worker"])
def test_single_node_four_ranks(scripts: Scripts, scope: str) -> None:
    """4 ranks on one node: one run either way (worker scope is global scope on one node),
    loss reduced to the mean of all four, every step in order."""
    results = torchrun(scripts, ["auto", scope, "plain"], nproc=4)
    assert results[0].returncode == 0, results[0].stderr[-12000:]
    (run,) = find_runs(scripts.wandb_dir)
    assert run.run_id == "base"
    assert [r["_step"] for r in run.history] == list(range(STEPS))
    for row in run.history:
        want = sum(expected_loss(r, row["_step"]) for r in range(4)) / 4
        assert row["loss"] == pytest.approx(want), (row, run.history, run.summary)
    assert run.summary["_funnel/ranks"] == 4
    assert leftovers_empty(scripts)


def test_auto_loss_equals_all_gather_mean(scripts: Scripts) -> None:
    """The funnel's reduced loss equals the all_gather mean, row by row (with no collective
    spent on logging)."""
    results = torchrun(scripts, ["auto", "global", "allgather"], nproc=3)
    assert results[0].returncode == 0, results[0].stderr[-3000:]
    from tests.conftest import reports

    gathered = reports(results[0].stdout)["gathered"]
    (run,) = find_runs(scripts.wandb_dir)
    assert [row["loss"] for row in run.history] == pytest.approx(gathered)
    assert leftovers_empty(scripts)


def test_rank_raising_fails_the_run(scripts: Scripts) -> None:
    """A rank that raises ends the run with a non-zero exit code, the job exits non-zero,
    and nothing is left behind (torchrun stops the other ranks with SIGTERM)."""
    results = torchrun(scripts, ["auto", "global", "raise"], nproc=2)
    assert results[0].returncode != 0
    (run,) = find_runs(scripts.wandb_dir)
    assert run.exit_code not in (None, 0)
    assert run.summary["_funnel/failed_ranks"] == 1  # rank 1's own goodbye said it raised
    assert any("r1" in row for row in run.history)  # rank 1's records before it raised
    assert leftovers_empty(scripts)


def test_sigterm_to_torchrun_drains_and_finishes(scripts: Scripts) -> None:
    """SIGTERM to torchrun (a scheduler stopping the job): the workers get SIGTERM, the
    logger drains and finishes the run within torchrun's grace period, exit code 143."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(DDP),
            "auto",
            "global",
            "slow",
            "--steps",
            str(STEPS),
        ],
        cwd=scripts.tmp_path,
        env=scripts.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    t0 = time.monotonic()
    wait_for_report(proc, "ready", timeout=90)
    proc.send_signal(signal.SIGTERM)
    res = scripts.finish(proc, 60, t0)
    assert res.returncode != 0
    (run,) = find_runs(scripts.wandb_dir)
    assert run.exit_code == 143
    steps = [r["_step"] for r in run.history]
    assert steps == sorted(steps) and steps[:4] == [0, 1, 2, 3]
    assert res.leftovers == []


def test_unauthenticated_clients_are_rejected_and_counted(scripts: Scripts) -> None:
    """Across nodes the logger listens on TCP with CURVE: clients without the job's keys (no
    CURVE, or a key pair of their own) are refused at the handshake, the refusals are counted
    (each reconnect attempt counts), none of their bytes reach the logger as frames, and the
    run is unaffected."""
    results = torchrun(scripts, ["auto", "global", "intruders"], nproc=1, nnodes=2)
    for res in results:
        assert res.returncode == 0, res.stderr[-3000:]
    (run,) = find_runs(scripts.wandb_dir)
    assert run.summary["_funnel/rejected_peers"] >= 2
    assert run.summary["_funnel/junk_frames"] == 0
    assert [r["_step"] for r in run.history] == list(range(STEPS))
    assert "refused" in results[0].stderr
    assert leftovers_empty(scripts)


@pytest.mark.timeout(240)
def test_ddp_example_trains_and_logs(scripts: Scripts) -> None:
    """examples/ddp_train.py under torchrun with 2 ranks: per-step loss and throughput rows
    in order, an eval accuracy row per epoch, exit code 0."""
    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(example),
            "--epochs",
            "2",
            "--id",
            "digits",
        ],
        cwd=scripts.tmp_path,
        env=scripts.env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,  # its stderr shows in the failure below
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = find_runs(scripts.wandb_dir)
    assert run.run_id == "digits" and run.exit_code == 0
    steps = [r["_step"] for r in run.history]
    assert steps == sorted(steps)
    assert len(run.column("eval/acc")) == 2
    assert all(0 <= acc <= 1 for _, acc in run.column("eval/acc"))
    assert all(tp > 0 for _, tp in run.column("throughput"))
    assert run.config["world_size"] == 2
    assert run.summary["_funnel/dropped_records"] == 0
    assert leftovers_empty(scripts)


@pytest.mark.timeout(240)
@pytest.mark.sink("wandb")  # what wandb wrote is checked
def test_media_from_a_rank_on_another_node_cross_as_bytes(scripts: Scripts) -> None:
    """Two "nodes" (rank 1 reaches the logger over TCP, with no shared staging directory):
    rank 1's wf.Image, wandb.Image and table image are sent as bytes in chunks ahead of its
    record, and land in the run as rank 0's do; tables concatenate, histograms merge."""
    results = torchrun(scripts, ["shared", "global", "media"], nproc=1, nnodes=2)
    for res in results:
        assert res.returncode == 0, res.stderr[-3000:]
    seen = reports("".join(res.stdout for res in results))
    assert seen["media_over_0"] == "files" and seen["media_over_1"] == "bytes"
    (run,) = find_runs(scripts.wandb_dir)
    (last,) = [row for row in run.history if "img/rank0._type" in row]
    files = run.path.parent / "files"
    for rank in (0, 1):
        assert last[f"img/rank{rank}.caption"] == f"rank {rank}"
        assert last[f"wimg/rank{rank}.caption"] == f"wandb rank {rank}"
        for key in ("img", "wimg"):
            assert (files / last[f"{key}/rank{rank}.path"]).is_file()
    assert last["table.nrows"] == 2 and last["hist.values"] == [1, 2]
    assert run.summary["_funnel/dropped_media"] == 0
    assert run.summary["_funnel/junk_frames"] == 0
    assert leftovers_empty(scripts)
