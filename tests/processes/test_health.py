"""Rank health with no collective (issue 27), under real torchrun with 4 gloo ranks: the
funnel names the rank that is stuck, the rank that logged NaN, the straggler, and shows the
running job to ``wandb-funnel status --json`` from another process."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.conftest import MARK_VAR, Scripts, program, reports
from tests.wandb_reader import WandbRun, find_runs

pytestmark = [pytest.mark.processes, pytest.mark.sink("wandb")]
HEALTH = program("health")


def _start(scripts: Scripts, scenario: str, *args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    return subprocess.Popen(
        [*cmd, "4", str(HEALTH), scenario, *args],
        cwd=scripts.tmp_path,
        env=scripts.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _read_until(
    proc: subprocess.Popen[str], want: str, stream: str, timeout: float
) -> tuple[str, str]:
    """Read the job's stdout and stderr until ``want`` appears in ``stream`` (bounded)."""
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    seen = {"stdout": "", "stderr": ""}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.2):
            line = key.fileobj.readline()  # type: ignore[union-attr]
            seen[key.data] += line
            if want in seen[stream]:
                sel.close()
                return seen["stdout"], seen["stderr"]
        if proc.poll() is not None and not sel.select(timeout=0):
            break
    sel.close()
    raise AssertionError(f"{want!r} not on {stream} within {timeout}s:\n{seen[stream][-3000:]}")


def _wait_for_the_run(scripts: Scripts, timeout: float = 60) -> WandbRun:
    """The job was killed: the logger (in its own session) finishes the run by itself."""
    from wandb_funnel.soak import jobenv

    deadline = time.monotonic() + timeout
    while jobenv.marked_processes(scripts.mark, MARK_VAR):
        assert time.monotonic() < deadline, "the job's processes did not end"
        time.sleep(0.2)
    runs = find_runs(scripts.wandb_dir)
    assert len(runs) == 1, runs
    return runs[0]


def _stop(scripts: Scripts, proc: subprocess.Popen[str]) -> None:
    """SIGKILL to torchrun and every rank, as a user's kill of a wedged job would; the
    logger and its wandb-core live on (they finish the run)."""
    from wandb_funnel.soak import jobenv

    for victim in jobenv.marked_processes(scripts.mark, MARK_VAR):
        try:
            cmd = " ".join(victim.cmdline())
            if "wandb_funnel._logger" not in cmd and "wandb-core" not in cmd:
                victim.kill()
        except Exception:
            pass  # gone meanwhile
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate(timeout=60)


@pytest.mark.timeout(240)
def test_a_rank_that_stops_is_named_while_the_others_wedge_in_all_reduce(
    scripts: Scripts,
) -> None:
    """Rank 3 sleeps before step 30 while ranks 0-2 wait in all_reduce: with
    stall_timeout=10, a line names rank 3 as behind within 35 s; the job is then stopped
    (SIGKILL) and the run's summary has _funnel/stalls >= 1."""
    proc = _start(scripts, "stall")
    try:
        _read_until(proc, '"ready"', "stdout", 120)
        t0 = time.monotonic()
        _, err = _read_until(proc, "rank 3 is behind", "stderr", 35 + 30)
        assert time.monotonic() - t0 < 35 + 10, "the report came late"
        line = next(x for x in err.splitlines() if "rank 3 is behind" in x)
        assert "rank 3 is behind: last step 29; ranks 0-2 at step 30" in line
        assert "no progress for" in line and "rank 0: step 30" in line
        _read_until(proc, "py-spy", "stderr", 30)  # rank 3's stack, or how to get one
    finally:
        _stop(scripts, proc)
    run = _wait_for_the_run(scripts)
    assert run.summary["_funnel/stalls"] >= 1
    assert "rank 3 is behind" in run.summary["_funnel/last_stall"]
    assert any("rank 3 is behind" in r.get("line", "") for r in run.output_raw)


@pytest.mark.timeout(200)
def test_a_nan_on_one_rank_is_named_and_counted(scripts: Scripts) -> None:
    proc = _start(scripts, "nan")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    assert "rank 1 logged nan for 'loss' at step 25" in err
    (run,) = find_runs(scripts.wandb_dir)
    assert run.summary["_funnel/nonfinite"] >= 1
    row = next(r for r in run.history if r["_step"] == 25)
    assert str(row["loss"]).lower() == "nan"  # the row is written as it was: a NaN mean


@pytest.mark.timeout(240)
def test_spread_names_the_straggler_and_status_shows_the_job(scripts: Scripts) -> None:
    """Rank 2's step_time is 0.2 s longer from step 10: the late rows have
    step_time/max_rank == 2 and _funnel/stragglers == [2]. Meanwhile `wandb-funnel status
    --json`, from another process, lists the funnel with its 4 ranks and their last steps."""
    proc = _start(scripts, "spread", "--steps", "40")
    try:
        out, _ = _read_until(proc, '"ready"', "stdout", 120)
        status = _status(scripts, want_ranks=4)
    finally:
        rest_out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    run_id = reports(out + rest_out)["run_id"]
    (funnel,) = [f for f in status["funnels"] if f["run_id"] == run_id]
    assert set(funnel) >= {  # the names of issue 27 (and "dropped", "close")
        "run_id",
        "name",
        "project",
        "owner_pid",
        "started",
        "state",
        "rows",
        "pending_rows",
        "ranks",
    }
    assert funnel["state"] == "running" and funnel["project"] == "health"
    ranks = funnel["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    for r in ranks:
        assert set(r) == {  # the names of issue 27, which scripts depend on
            "rank",
            "pid",
            "host",
            "state",
            "last_step",
            "since_last_s",
            "records",
            "dropped",
            "steps_per_s",
        }
        assert r["last_step"] >= 5 and r["state"] in ("alive", "silent")
    assert "rank 2 is a straggler" in err
    (run,) = find_runs(scripts.wandb_dir)
    late = [r for r in run.history if r["_step"] >= 12]
    assert late and all(r["step_time/max_rank"] == 2 for r in late)
    assert all(r["step_time/max"] > 0.2 for r in late)
    assert run.summary["_funnel/stragglers"] == [2]


def _status(scripts: Scripts, want_ranks: int, timeout: float = 30) -> dict[str, Any]:
    """``wandb-funnel status --json`` as another process of the user runs it, until the
    funnel shows ``want_ranks`` ranks, each past step 5."""
    exe = os.path.join(os.path.dirname(sys.executable), "wandb-funnel")
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        done = subprocess.run(
            [exe, "status", "--json"],
            env=scripts.env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        last = json.loads(done.stdout)
        # Every rank listed and past step 5 (rank 0 said "ready" there; the others log in
        # lockstep, but a rank's first batch may reach the logger after its hello).
        if any(
            len(f["ranks"]) >= want_ranks and all(r["last_step"] >= 5 for r in f["ranks"])
            for f in last["funnels"]
        ):
            return last
        time.sleep(0.5)
    raise AssertionError(f"no funnel with {want_ranks} ranks past step 5: {last}")


def test_a_long_close_says_how_far_it_is(scripts: Scripts) -> None:
    """A close that takes longer than 2 s says, once a second, how many rows are left and how
    much of its budget; the run still gets every row. The sink takes 1 ms a row on purpose
    (``null:0.001``): 5,000 rows keep the close busy about 5 s however loaded the machine is
    (with wandb's own speed, the owner could be slowed as much as the logger, and a close
    with little left said nothing: failed twice under load)."""
    sink = {"WANDB_FUNNEL_SINK": "null:0.001"}
    res = scripts.run_file(program("lifecycle"), ["slow-close", "--rows", "5000"], 150, sink)
    assert res.returncode == 0, res.stderr[-3000:]
    said = [line for line in res.stderr.splitlines() if "rows left to write" in line]
    assert said, res.stderr[-3000:]
    lefts = [int(line.split("closing: ")[1].split()[0]) for line in said]
    assert lefts == sorted(lefts, reverse=True) and lefts[0] > 0  # counting down
    assert reports(res.stdout)["stats"]["_funnel/rows"] == 5_000
