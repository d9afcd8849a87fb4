"""The owner of tests/processes/test_wandb_versions.py: what differs between wandb releases,
exercised through the funnel on whichever wandb is installed.

    python versions.py [--goal]

Two spawn workers and the owner log 5 steps each, print a line each (the console goes
through wandb's interface, named differently before wandb 0.26.1), sample their system
metrics (``publish_stats``, the same interface), and save files: a literal name with ``[``
in it (``glob=False``, which wandb's save has only from 0.28.1) and a glob.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from typing import Any

from _prelude import report

import wandb_funnel as wf


def worker(rank: int, attached: Any) -> None:
    run = wf.init()  # attaches to the owner's funnel, which it finds in its environment
    attached.wait()  # every rank attached before any logs: no late rows
    print(f"worker {rank} says hello", flush=True)
    for step in range(5):
        run.log({"loss": 1.0 / (step + 1), f"w{rank}": step}, step=step)
        time.sleep(0.2)  # long enough for two system-metrics samples
    run.finish()


def goal() -> None:
    """``define_metric(goal=...)``: REPORT whether it was refused at the call (TypeError)."""
    with wf.Funnel(project="versions") as funnel:
        try:
            funnel.run.define_metric("acc", goal="maximize")
            refused = False
        except TypeError:
            refused = True
        funnel.run.log({"acc": 1.0}, step=0)
    report(goal_refused=refused)


def main() -> None:
    if sys.argv[1:] == ["--goal"]:
        goal()
        return
    with open("weird[1].txt", "w") as f:
        f.write("a literal name")
    os.makedirs("ckpt", exist_ok=True)
    for name in ("a.bin", "b.bin"):
        with open(os.path.join("ckpt", name), "w") as f:
            f.write(name)
    ctx = mp.get_context("spawn")
    with wf.Funnel(project="versions", settings={"x_stats_sampling_interval": 0.5}) as funnel:
        run = funnel.run
        attached = ctx.Barrier(3)
        procs = [ctx.Process(target=worker, args=(r, attached)) for r in (1, 2)]
        for p in procs:
            p.start()
        attached.wait(60)
        print("owner says hello", flush=True)
        run.define_metric("loss", summary="min")
        for step in range(5):
            run.log({"owner": step}, step=step)
        run.save("weird[1].txt", policy="now", glob=False)
        run.save("ckpt/*.bin", policy="now")
        for p in procs:
            p.join(60)
    report(exitcodes=[p.exitcode for p in procs], stats=funnel.stats)


if __name__ == "__main__":
    main()
