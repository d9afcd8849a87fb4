"""One run across torchrun's restarts, ONLINE (issue 37): the torchrun job of
``tests/processes/test_requeue.py`` (two gloo ranks, ``--max-restarts 1``, rank 1 fails at
step 12 of the first attempt, the second resumes from the checkpoint at step 9) run against
OpenWandb behind the fault proxy, and read back from the SERVER (its database and files:
``wandb.Api()`` reads do not work against OpenWandb; ``tests/online/openwandb.py``).

The program logs to the project ``requeue`` whatever the test's own project is, and one
OpenWandb serves the whole session: "the runs of this job" are the project's runs that were
not there before the job ran.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from tests.conftest import Scripts, program
from tests.online.conftest import Online
from tests.online.openwandb import ServerRun
from tests.wandb_reader import step_of

pytestmark = [pytest.mark.online, pytest.mark.processes]

REQUEUE = program("requeue")
PROJECT = "requeue"  # the program's own (wandb.init(project="requeue"))
STEPS = 20
JOB_TIMEOUT = 240.0


def _torchrun(online: Online, scripts: Scripts, *args: str) -> tuple[int, str, str]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        str(REQUEUE),
        "torchrun",
        "--ckpt",
        str(scripts.tmp_path / "ckpt"),
        *args,
    ]
    done = scripts.run_command(cmd, extra_env=online.env, timeout=JOB_TIMEOUT)
    return done.returncode, done.stdout, done.stderr


def _reports(stdout: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[len("REPORT ") :])
        for line in stdout.splitlines()
        if line.startswith("REPORT ")
    ]


def _starts(stdout: str) -> list[dict[str, Any]]:
    """Rank 0's start REPORT of each attempt, in order."""
    return [r for r in _reports(stdout) if "start" in r and r["rank"] == 0]


def _new_runs(online: Online, before: list[str]) -> list[str]:
    """The project's runs on the server that were not there before the job, oldest first."""
    return [r for r in online.server.run_ids(PROJECT) if r not in before]


def _server_run(online: Online, run_id: str) -> ServerRun:
    return online.server.run(PROJECT, run_id, proxy=online.proxy)


def _attempt_rows(run: ServerRun) -> dict[int, list[int]]:
    """step -> the attempts whose rows hold it, in the order the server stored them."""
    out: dict[int, list[int]] = {}
    for row in run.history:
        if "attempt" in row:
            out.setdefault(int(step_of(row)), []).append(int(row["attempt"]))
    return out


@pytest.mark.timeout(300)
def test_torchrun_restarts_continue_one_run_on_the_server(online: Online, scripts: Scripts) -> None:
    """Through the funnel: ONE run on the server for both attempts, finished, exit code 0
    (the last filestream request's, as the proxy saw it), the console's "continuing run".

    The history is read whole (``wandb-history.jsonl``: the filestream's lines in arrival
    order; the server stored each line the proxy passed, once). It has every step 0..19, each
    row with ``attempt`` and ``loss``. A step the second attempt logged again (from the
    checkpoint up to where the first stopped) is there twice: the first attempt's row, then
    the second's, at the next free ``_step`` with its own step under ``global_step`` and
    ``_funnel/step``; every later row of that attempt moves up as many steps of ``_step``, keeping
    its step the same way. ``_step`` never goes back and never repeats.

    The summary: the server's own (the filestream's scalars; no key that starts with ``_``)
    has ``attempt`` 1; ``_funnel/relogged_steps`` is read from the uploaded
    ``wandb-summary.json`` (``attempt`` 1 there too): the steps logged twice, > 0.
    """
    before = online.server.run_ids(PROJECT)
    code, out, err = _torchrun(online, scripts)
    assert code == 0, err[-4000:]
    starts = _starts(out)
    assert [r["attempt"] for r in starts] == [0, 1], out[-3000:]
    run_id = starts[0]["run_id"]
    assert {r["run_id"] for r in starts} == {run_id}  # both attempts saw one run id
    assert "continuing run" in err and "restart 1 of torchrun run" in err, err[-3000:]
    resumed_from = int(starts[1]["start"])
    assert 0 < resumed_from < STEPS

    assert _new_runs(online, before) == [run_id], "one run on the server for both attempts"
    run = online.server.wait_for_run(
        PROJECT,
        run_id,
        lambda r: r.state == "finished" and r.summary_file is not None,
        proxy=online.proxy,
    )
    assert run.state == "finished" and run.exit_code == 0, (run.state, run.exit_code)

    rows = _attempt_rows(run)
    assert sorted(rows) == list(range(STEPS)), rows
    for step, attempts in rows.items():
        assert attempts[-1] == (1 if step >= resumed_from else 0), (step, attempts)
        assert attempts == sorted(attempts), (step, attempts)  # the first attempt's first
        assert len(attempts) == len(set(attempts)), (step, attempts)  # no row stored twice
    for row in run.history:
        if "attempt" in row:
            assert row["loss"] == pytest.approx(1.0 / (step_of(row) + 1)), row
    relogged = sorted(s for s, a in rows.items() if a == [0, 1])
    assert relogged and relogged[0] == resumed_from, (relogged, resumed_from)
    # The second attempt's rows go on past the first's last _step: each keeps its own step
    # under global_step and _funnel/step, the relogged ones and those they moved up alike.
    for row in run.history:
        if row.get("attempt") == 1:
            own = int(step_of(row))
            assert row["_funnel/step"] == row["global_step"] == own, row
            assert row["_step"] == own + len(relogged), (row, relogged)
    steps = run.steps
    assert steps == sorted(steps) and len(set(steps)) == len(steps), steps
    assert online.proxy.history_lines()[run_id] == len(run.history)  # each line stored once

    assert run.summary["attempt"] == 1, run.summary  # the last attempt's last values
    assert run.summary_file is not None
    assert run.summary_file["attempt"] == 1
    assert run.summary_file["_funnel/relogged_steps"] == len(relogged) > 0, run.summary_file
    assert "continuing run" in (run.output_log or "")


@pytest.mark.timeout(300)
def test_plain_wandb_under_the_same_restarts_makes_a_run_per_attempt_on_the_server(
    online: Online, scripts: Scripts
) -> None:
    """Plain wandb in rank 0, the same job: TWO runs on the server, one per attempt; the
    first has the first attempt's rows from step 0, at least up to the checkpoint; the second
    (finished, exit code 0) has the steps from the checkpoint to the end, each once, all of
    the second attempt."""
    before = online.server.run_ids(PROJECT)
    code, out, err = _torchrun(online, scripts, "--plain")
    assert code == 0, err[-4000:]
    starts = _starts(out)
    assert [r["attempt"] for r in starts] == [0, 1], out[-3000:]
    ids = [r["run_id"] for r in starts]
    assert len(set(ids)) == 2, ids
    assert sorted(_new_runs(online, before)) == sorted(ids), "a run per attempt"

    resumed_from = int(starts[1]["start"])
    first = _server_run(online, ids[0])  # rank 0 SIGTERMed by torchrun: wandb-core ends it
    assert {row.get("attempt") for row in first.history} == {0}, first.history
    assert first.steps == list(range(len(first.steps))) and len(first.steps) >= resumed_from
    second = online.server.wait_for_run(
        PROJECT, ids[1], lambda r: r.state == "finished", proxy=online.proxy
    )
    assert second.state == "finished" and second.exit_code == 0
    assert second.steps == list(range(resumed_from, STEPS)), second.steps
    assert {row["attempt"] for row in second.history} == {1}
    assert second.summary["attempt"] == 1
