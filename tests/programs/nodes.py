"""One rank of tests/processes/test_nodes.py: two torchrun agents on 127.0.0.1 stand in for two
nodes of two ranks each (issue 38).

    torchrun --nnodes 2 --node-rank N --nproc-per-node 2 --master-addr 127.0.0.1 \\
        --master-port P nodes.py TIER BEHAVIOUR --steps S

Every rank logs at every step: ``loss`` (a float: mean), ``peak`` (an int: max), ``tokens``
(an int: sum), at even steps ``t`` (a float: spread, with the ranks of its min and max), and a
key of its own. Before the first step rank 0 asks ``wandb-funnel status --json`` until it lists both
nodes with rank 2 and 3 on node 1 (bounded), and REPORTs what it saw. BEHAVIOUR:

- ``plain``: just that;
- ``kill-node-logger``: the rank of node 1 that started node 1's node logger (the first of
  ranks 2 and 3 to reach ``wf.init``) SIGKILLs it at step ``S // 2`` and REPORTs its pid;
  every rank goes on;
- ``kill-root-logger``: rank 0 SIGKILLs the root logger (the funnel's) at step ``S // 2``
  and REPORTs its pid; every rank goes on;
- ``kill-node-logger-media``: as ``kill-node-logger``, but that rank first SIGSTOPs the node
  logger, logs an image (``img``, its bytes sent ahead of the record, to the stopped node
  logger), waits, then SIGKILLs it: the image's bytes die with it, and reach the run only if
  the rank resends them with the record.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np
import torch.distributed as dist
from _prelude import report

import wandb_funnel as wf

REDUCE = {"peak": "max", "tokens": "sum", "t": "spread"}


def values(rank: int, step: int) -> dict[str, float | int]:
    """What ``rank`` logs at ``step`` (tests/processes/test_nodes.py reduces the same): ``t``
    at even steps only, so that the node logger pre-reduces the odd ones (a ``spread`` key
    goes as it came, and so does its batch)."""
    out: dict[str, float | int] = {
        "loss": ((rank * 7 + step * 3) % 11) / 3.0 + 1e-9 * rank,
        "peak": rank * 10 + step,
        "tokens": rank + step,
    }
    if step % 2 == 0:
        out["t"] = 0.5 * (rank + 1) + 0.01 * step
    return out


def status_nodes(
    run_id: str, want: int, timeout: float, node1: dict[str, int] | None = None
) -> list[dict[str, Any]]:
    """``wandb-funnel status --json``'s nodes of this run, once it lists ``want`` nodes (and
    node 1's fields are at least ``node1``'s)."""
    deadline = time.monotonic() + timeout
    nodes: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        out = subprocess.run(
            [sys.executable, "-m", "wandb_funnel", "status", "--json"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        for funnel in json.loads(out)["funnels"]:
            if funnel["run_id"] == run_id:
                nodes = funnel["nodes"] or []
        ranks = sorted(r for n in nodes for r in n["ranks"])
        reached = all(n[k] >= v for n in nodes if n["node"] == 1 for k, v in (node1 or {}).items())
        if len(nodes) == want and ranks == list(range(4)) and reached:
            return nodes
        time.sleep(0.3)
    return nodes


def node_logger_pid() -> int | None:
    """This rank's child that is its node's node logger, if this rank started it."""
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = fh.read().rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        if ppid == me and b"_node.__main__" in cmdline:
            return int(pid)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("tier", choices=["node", "flat", "auto"])
    behaviours = ["plain", "kill-node-logger", "kill-root-logger", "kill-node-logger-media"]
    parser.add_argument("behaviour", choices=behaviours)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.02)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    run = wf.init(project="nodes", id="base", tier=args.tier, reduce=REDUCE)
    dist.barrier()
    if rank == 0:
        want = 2 if args.tier != "flat" else 0
        nodes = status_nodes("base", want, 30.0) if want else []
        report(status_nodes=nodes, tier_pid=os.getpid())
    dist.barrier()
    for step in range(args.steps):
        kill_node = args.behaviour.startswith("kill-node-logger") and rank in (2, 3)
        extra: dict[str, object] = {}
        if kill_node and step == args.steps // 2 and (pid := node_logger_pid()) is not None:
            if args.behaviour == "kill-node-logger-media":
                os.kill(pid, signal.SIGSTOP)
                pixels = np.full((8, 8, 3), rank * 40, dtype=np.uint8)
                run.log({"img": wf.Image(pixels)}, step=step, commit=False)
                extra = {"img_rank": rank}
                time.sleep(0.3)  # the bytes leave this process, for the stopped one
            os.kill(pid, signal.SIGKILL)
            report(killed_node_logger=pid, **extra)
        if args.behaviour == "kill-root-logger" and rank == 0 and step == args.steps // 2:
            pid = run._info.logger_pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            report(killed_root_logger=pid)
        run.log({**values(rank, step), f"r{rank}": step}, step=step)
        time.sleep(args.delay)
    if rank == 0 and args.tier != "flat":  # node 1's counts, once its ranks' hellos are in
        restarted = int(args.behaviour == "kill-node-logger")  # (then its successor's)
        node1 = {"forwarded": 2, "restarts": restarted}
        if args.behaviour == "plain":
            node1["folded"] = 1  # (its batches of the odd steps, pre-reduced)
        report(status_nodes_end=status_nodes("base", 2, 30.0, node1))
    dist.barrier()
    run.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
