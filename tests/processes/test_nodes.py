"""The node tier (issue 38) under real torchrun: two agents on 127.0.0.1 (``--nnodes 2
--node-rank 0|1``, static rendezvous) are two nodes of 2 ranks each; node 1's ranks reach the
root logger through node 1's node logger. Read back from what wandb wrote."""

from __future__ import annotations

import math
import re
import subprocess
from typing import Any

import pytest

from tests.conftest import Scripts, leftover_processes, program, reports, torchrun_agents
from tests.wandb_reader import WandbRun, only_run

pytestmark = [pytest.mark.processes, pytest.mark.sink("wandb")]

NODES = program("nodes")
RANKS = range(4)


def _values(rank: int, step: int) -> dict[str, Any]:
    # tests/programs/nodes.py's values(), computed again here
    out = {
        "loss": ((rank * 7 + step * 3) % 11) / 3.0 + 1e-9 * rank,
        "peak": rank * 10 + step,
        "tokens": rank + step,
    }
    if step % 2 == 0:
        out["t"] = 0.5 * (rank + 1) + 0.01 * step
    return out


def _expected_row(step: int) -> dict[str, Any]:
    """The flat funnel's reductions of the four ranks' values (``_logger/reduce.py``)."""
    by_rank = [_values(r, step) for r in RANKS]
    row = {
        "loss": math.fsum(v["loss"] for v in by_rank) / 4,
        "peak": max(v["peak"] for v in by_rank),
        "tokens": sum(v["tokens"] for v in by_rank),
        **{f"r{r}": step for r in RANKS},
    }
    if step % 2 == 0:
        ts = [v["t"] for v in by_rank]
        row["t"] = math.fsum(ts) / 4
        row["t/min"], row["t/max"] = min(ts), max(ts)
        row["t/min_rank"], row["t/max_rank"] = ts.index(min(ts)), ts.index(max(ts))
    return row


_KEYS = {*_expected_row(0), "t", "t/min", "t/max", "t/min_rank", "t/max_rank"}


def _job(
    scripts: Scripts, tier: str, behaviour: str, steps: int
) -> tuple[list[subprocess.CompletedProcess[str]], WandbRun, dict[str, Any]]:
    argv = [str(NODES), tier, behaviour, "--steps", str(steps)]
    results = torchrun_agents(scripts, argv, nproc=2, nnodes=2, timeout=150)
    for res in results:
        assert res.returncode == 0, res.stderr[-4000:]
    assert leftover_processes(scripts.mark) == []
    return results, only_run(scripts.wandb_dir), reports("".join(r.stdout for r in results))


def _user_rows(run: WandbRun, steps: int) -> list[dict[str, Any]]:
    rows = [{k: v for k, v in row.items() if k in _KEYS} for row in run.history]
    assert [row["_step"] for row in run.history] == list(range(steps))
    return rows


def test_two_nodes_one_run_exact_reductions_and_status(scripts: Scripts) -> None:
    """Node tier: one run; every row is the exact reduction of the four ranks (mean, max,
    sum, spread with its ranks); ``_funnel/nodes`` is 2; ``wandb-funnel status --json``
    listed both nodes, each with its logger's pid and its ranks; nothing is dropped."""
    steps = 20
    _, run, seen = _job(scripts, "node", "plain", steps)
    rows = _user_rows(run, steps)
    assert rows == [_expected_row(step) for step in range(steps)]
    assert run.summary["_funnel/nodes"] == 2
    assert run.summary["_funnel/ranks"] == 4
    assert run.summary["_funnel/dropped_records"] == 0
    assert run.summary["_funnel/records"] == 4 * steps
    # health through the tier names the global rank: rank 3 (node 1) has the largest t
    assert run.summary["_funnel/stragglers"] == [3]
    nodes = {n["node"]: n for n in seen["status_nodes"]}
    assert set(nodes) == {0, 1}, seen["status_nodes"]
    assert nodes[0]["ranks"] == [0, 1] and nodes[1]["ranks"] == [2, 3]
    assert all(n["state"] == "live" for n in nodes.values())
    # node 0's is the root logger; node 1's is a process of its own
    assert isinstance(nodes[1]["logger_pid"], int) and nodes[1]["logger_pid"] > 0
    assert nodes[0]["logger_pid"] != nodes[1]["logger_pid"]
    assert nodes[0]["logger_pid"] != seen["tier_pid"]
    # what node 1's node logger forwarded (its ranks' frames), and nothing malformed
    (node1,) = [n for n in seen["status_nodes_end"] if n["node"] == 1]
    assert node1["forwarded"] >= 2 and node1["stale"] == 0 and node1["junk"] == 0, node1
    # it pre-reduced its ranks' batches of the odd steps (those without the spread key)
    assert node1["folded"] >= 1, node1


def test_flat_tier_gives_the_same_user_values(scripts: Scripts) -> None:
    """``tier="flat"`` on the same two nodes: the same rows, value for value, and no
    ``_funnel/nodes``."""
    steps = 20
    _, run, seen = _job(scripts, "flat", "plain", steps)
    rows = _user_rows(run, steps)
    assert rows == [_expected_row(step) for step in range(steps)]
    assert "_funnel/nodes" not in run.summary
    assert seen["status_nodes"] == []


def test_a_sigkilled_node_logger_loses_no_rank_s_record(scripts: Scripts) -> None:
    """Node 1's node logger SIGKILLed mid-run: a new one takes over, node 1's ranks resend
    what the root had not saved, and every step of every rank is in the run exactly once,
    reduced exactly; nothing is counted dropped."""
    steps = 80
    results, run, seen = _job(scripts, "node", "kill-node-logger", steps)
    killed = seen["killed_node_logger"]
    err = "".join(r.stderr for r in results)
    said = re.search(rf"the node logger of node 1 \(pid {killed}\) was killed by SIGKILL", err)
    assert said, err[-4000:]
    rows = _user_rows(run, steps)
    assert rows == [_expected_row(step) for step in range(steps)]
    assert run.summary["_funnel/records"] == 4 * steps
    assert run.summary["_funnel/dropped_records"] == 0
    assert run.summary["_funnel/late_records"] == 0
    # status: node 1's second node logger, what it forwarded, nothing malformed
    (node1,) = [n for n in seen["status_nodes_end"] if n["node"] == 1]
    assert node1["restarts"] == 1 and node1["logger_pid"] != killed, (node1, killed)
    assert node1["forwarded"] >= 2 and node1["junk"] == 0, node1


def test_an_image_in_flight_in_a_sigkilled_node_logger_reaches_the_run(scripts: Scripts) -> None:
    """Node 1's node logger is stopped, a rank of node 1 logs an image (its bytes go ahead of
    the record, to the stopped node logger), then the node logger is SIGKILLed: the bytes
    died with it. The rank resends them with its unsaved records, so the image is in the
    run, at its step, once; nothing is dropped (issue 38)."""
    steps = 40
    _, run, seen = _job(scripts, "node", "kill-node-logger-media", steps)
    assert _user_rows(run, steps) == [_expected_row(step) for step in range(steps)]
    at = [row["_step"] for row in run.history if "img._type" in row]
    assert at == [steps // 2], at
    (row,) = [row for row in run.history if "img._type" in row]
    assert row["img._type"] == "image-file"
    path = run.path.parent / "files" / row["img.path"]
    assert path.is_file() and path.stat().st_size > 0, path
    assert run.summary["_funnel/media"] == 1
    assert run.summary["_funnel/dropped_media"] == 0
    assert run.summary["_funnel/dropped_records"] == 0
    assert seen["img_rank"] in (2, 3)


def test_the_root_logger_sigkilled_loses_no_rank_s_record_through_the_tier(
    scripts: Scripts,
) -> None:
    """The root logger SIGKILLed mid-run: the owner starts a new one, which continues the
    run; node 1's ranks, through their node logger, resend what was not saved: every step
    of every rank once, reduced exactly."""
    steps = 80
    _, run, seen = _job(scripts, "node", "kill-root-logger", steps)
    assert seen["killed_root_logger"] > 0
    rows = _user_rows(run, steps)
    assert rows == [_expected_row(step) for step in range(steps)]
    assert run.summary["_funnel/logger_restarts"] == 1
    assert run.summary["_funnel/records"] == 4 * steps
    assert run.summary["_funnel/dropped_records"] == 0
    assert run.summary["_funnel/nodes"] == 2


def test_wandb_funnel_run_on_each_node_gives_one_run_through_the_node_tier(
    scripts: Scripts,
) -> None:
    """An unmodified wandb script under ``wandb-funnel run`` on each of the two agents: the
    first rank of node 1 to call ``wandb.init`` starts its node logger; one run, the mean of
    the four ranks at every step, ``_funnel/nodes == 2``."""
    import pathlib
    import sys

    cli = str(pathlib.Path(sys.executable).with_name("wandb-funnel"))
    argv = [str(program("nodes_wandb"))]
    results = torchrun_agents(scripts, argv, 2, 2, 150, prefix=(cli, "run", "--"))
    for res in results:
        assert res.returncode == 0, res.stderr[-4000:]
    assert leftover_processes(scripts.mark) == []
    run = only_run(scripts.wandb_dir)
    assert [row["_step"] for row in run.history] == list(range(10))
    for row in run.history:
        step = row["_step"]
        assert row["loss"] == math.fsum(float(r + step) for r in RANKS) / 4
        assert [row[f"r{r}"] for r in RANKS] == [step] * 4
    assert run.summary["_funnel/nodes"] == 2
    assert run.summary["_funnel/ranks"] == 4
