"""DDP ranks under real torchrun (gloo on CPU) funnel into exactly the runs asked for."""

from __future__ import annotations

import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import Scripts, wait_for_report
from tests.wandb_reader import WandbRun, find_runs

pytestmark = pytest.mark.processes

STEPS = 15

DDP = f"""
import json, os, sys, time
import torch, torch.distributed as dist
import wandb_funnel as wf

def report(**kw):
    # One write per line: ranks share torchrun's stdout, and print() writes the text and
    # its newline separately when unbuffered, so two ranks' lines could run together.
    sys.stdout.write("REPORT " + json.dumps(kw) + "\\n")
    sys.stdout.flush()

mode, scope, behaviour = sys.argv[1], sys.argv[2], sys.argv[3]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
# A wide window: 4 ranks on 2 CI cores can be descheduled for seconds, and these tests are
# about what is merged, not about how long a straggler may hold rows (tested elsewhere).
run = wf.init(project="t", id="base", run_mode=mode, rank_scope=scope, reduce={{"tput": "sum"}},
              reorder_window=30)
# As a DDP training step would (its allreduce): no rank logs before every rank attached. The
# merge at step 0 is promised for ranks that synchronise after init; without this, rank 0
# on a loaded box logged all its steps and finished the run before ranks 2 and 3 attached.
dist.barrier()
report(rank=rank, run_id=run.id)
gathered = []
for step in range({STEPS}):
    loss = torch.tensor(float((rank * 7 + step * 3) % 11) / 3.0)
    run.log({{"loss": loss, "tput": 1.0, f"r{{rank}}": step}}, step=step)
    if behaviour == "allgather":
        parts = [torch.zeros(()) for _ in range(world)]
        dist.all_gather(parts, loss)
        gathered.append(float(sum(parts)) / world)
    if behaviour == "raise" and rank == 1 and step == 5:
        raise RuntimeError("rank 1 fails")
    if behaviour == "slow":
        time.sleep(0.2)
        if rank == 0 and step == 3:
            report(ready=True)
# The hosting rank's run is finished by its Funnel's close (a bound method of the Funnel).
funnel = getattr(run._on_finish, "__self__", None)
if behaviour == "intruders" and isinstance(funnel, wf.Funnel):
    import zmq
    ctx = zmq.Context()
    for curve in (False, True):
        s = ctx.socket(zmq.DEALER); s.setsockopt(zmq.LINGER, 0)
        if curve:  # a client with keys of its own, not the job's
            pub, sec = zmq.curve_keypair()
            s.curve_serverkey = run._info.curve["server_public"].encode()
            s.curve_publickey, s.curve_secretkey = pub, sec
        s.connect(funnel.tcp_address)
        s.send(b"hello?")
        time.sleep(0.5)
        s.close()
    ctx.term()
if rank == 0 and behaviour == "allgather":
    report(gathered=gathered)
run.finish()
dist.barrier()
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(scripts: Scripts, args: list[str], nproc: int, nnodes: int = 1,
             timeout: float = 120) -> list[subprocess.CompletedProcess[str]]:
    """Run the DDP scenario under real torchrun: ``nnodes`` torchrun invocations against one
    localhost master, each in a process group of its own."""
    script = scripts.write(DDP)
    port = _free_port()
    procs = []
    for node in range(nnodes):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
        if nnodes == 1:
            cmd += ["--standalone"]
        else:
            cmd += ["--nnodes", str(nnodes), "--node-rank", str(node),
                    "--master-addr", "127.0.0.1", "--master-port", str(port)]
        procs.append(subprocess.Popen(
            [*cmd, str(script), *args], cwd=scripts.tmp_path, env=scripts.env(),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        ))
    t0 = time.monotonic()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


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
        ("new", "worker", {"base-worker-0-rank-0": ("base-worker-0", [0]),
                           "base-worker-1-rank-0": ("base-worker-1", [1])}),
    ],
)
def test_mode_scope_matrix_on_two_nodes(scripts: Scripts, mode: str, scope: str,
                                        runs: dict[str, tuple[str, list[int]]]) -> None:
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
        assert [r["global_step"] for r in run.history] == list(range(STEPS))
        for row in run.history:
            step = row["global_step"]
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
        assert run.summary["funnel/dropped_records"] == 0
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
    assert [r["global_step"] for r in run.history] == list(range(STEPS))
    for row in run.history:
        want = sum(expected_loss(r, row["global_step"]) for r in range(4)) / 4
        assert row["loss"] == pytest.approx(want), (row, run.history, run.summary)
    assert run.summary["funnel/ranks"] == 4
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
    assert run.summary["funnel/failed_ranks"] == 1  # rank 1's own goodbye said it raised
    assert any("r1" in row for row in run.history)  # rank 1's records before it raised
    assert leftovers_empty(scripts)


def test_sigterm_to_torchrun_drains_and_finishes(scripts: Scripts) -> None:
    """SIGTERM to torchrun (a scheduler stopping the job): the workers get SIGTERM, the
    logger drains and finishes the run within torchrun's grace period, exit code 143."""
    script = scripts.write(DDP)
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", str(script), "auto", "global", "slow"],
        cwd=scripts.tmp_path, env=scripts.env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    t0 = time.monotonic()
    wait_for_report(proc, "ready", timeout=90)
    proc.send_signal(signal.SIGTERM)
    res = scripts.finish(proc, 60, t0)
    assert res.returncode != 0
    (run,) = find_runs(scripts.wandb_dir)
    assert run.exit_code == 143
    steps = [r["global_step"] for r in run.history]
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
    assert run.summary["funnel/rejected_peers"] >= 2
    assert run.summary["funnel/junk_frames"] == 0
    assert [r["global_step"] for r in run.history] == list(range(STEPS))
    assert "refused" in results[0].stderr
    assert leftovers_empty(scripts)


@pytest.mark.timeout(240)
def test_ddp_example_trains_and_logs(scripts: Scripts) -> None:
    """examples/ddp_train.py under torchrun with 2 ranks: per-step loss and throughput rows
    in order, an eval accuracy row per epoch, exit code 0."""
    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(example), "--epochs", "2", "--id", "digits"],
        cwd=scripts.tmp_path, env=scripts.env(), capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = find_runs(scripts.wandb_dir)
    assert run.run_id == "digits" and run.exit_code == 0
    steps = [r["global_step"] for r in run.history]
    assert steps == sorted(steps)
    assert len(run.column("eval/acc")) == 2
    assert all(0 <= acc <= 1 for _, acc in run.column("eval/acc"))
    assert all(tp > 0 for _, tp in run.column("throughput"))
    assert run.config["world_size"] == 2
    assert run.summary["funnel/dropped_records"] == 0
    assert leftovers_empty(scripts)
